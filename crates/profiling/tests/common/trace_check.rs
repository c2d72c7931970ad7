//! Structure checks of a Chrome trace (what Perfetto and chrome://tracing need), shared by the profiler tests and the training-step trace test.
use serde_json::Value;
use std::collections::{HashMap, HashSet};

fn num(e: &Value, key: &str) -> f64 {
    e[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {e}"))
}

/// The structure Perfetto and chrome://tracing need, checked on a parsed trace.
pub fn check_trace(json: &str) -> Vec<Value> {
    let v: Value = serde_json::from_str(json).expect("trace is valid JSON");
    let events = v["traceEvents"]
        .as_array()
        .expect("traceEvents array")
        .clone();
    let mut names: HashSet<(u64, Option<u64>)> = HashSet::new();
    for e in events.iter().filter(|e| e["ph"] == "M") {
        let (pid, tid) = (e["pid"].as_u64().unwrap(), e["tid"].as_u64());
        assert!(
            e["args"]["name"].is_string() || e["args"]["sort_index"].is_number(),
            "{e}"
        );
        match e["name"].as_str().unwrap() {
            "process_name" => {
                names.insert((pid, None));
            }
            "thread_name" => {
                names.insert((pid, tid));
            }
            "process_sort_index" => {}
            other => panic!("unknown metadata {other}"),
        }
    }
    let mut last: HashMap<(u64, u64), f64> = HashMap::new();
    // Open slices per track: complete events on one track must nest.
    let mut open: HashMap<(u64, u64), Vec<f64>> = HashMap::new();
    let mut xs = Vec::new();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        assert!(e["name"].is_string() && e["cat"].is_string(), "{e}");
        let (ts, dur) = (num(e, "ts"), num(e, "dur"));
        assert!(ts >= 0.0 && dur >= 0.0, "{e}");
        let track = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
        assert!(names.contains(&(track.0, None)), "process of {e} unnamed");
        assert!(
            names.contains(&(track.0, Some(track.1))),
            "thread of {e} unnamed"
        );
        let prev = last.insert(track, ts).unwrap_or(f64::MIN);
        assert!(
            ts >= prev,
            "ts goes back on track {track:?}: {prev} then {e}"
        );
        let stack = open.entry(track).or_default();
        while stack.last().is_some_and(|&end| end <= ts) {
            stack.pop();
        }
        if let Some(&end) = stack.last() {
            assert!(ts + dur <= end + 1e-6, "{e} overlaps its enclosing slice");
        }
        stack.push(ts + dur);
        xs.push(e.clone());
    }
    // Flow events come in start/finish pairs.
    let mut flows: HashMap<u64, Vec<String>> = HashMap::new();
    for e in events.iter().filter(|e| e["ph"] == "s" || e["ph"] == "f") {
        flows
            .entry(e["id"].as_u64().unwrap())
            .or_default()
            .push(e["ph"].as_str().unwrap().to_string());
    }
    for (id, phases) in flows {
        assert_eq!(phases, ["s", "f"], "flow {id}");
    }
    xs
}
