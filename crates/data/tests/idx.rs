//! IDX reader: round trips (plain and gzip), every element type, and each kind of corrupt file giving an error that names the file.
mod common;
use common::TempDir;
use flate2::write::GzEncoder;
use flate2::Compression;
use netcl_data::idx::{
    encode_idx_u8, parse_idx, read_idx, write_idx_u8, IdxData, IdxType, MAX_IDX_DATA_BYTES,
};
use std::io::Write;

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// The error message of reading `bytes` from a file called `name`, checked to name the file.
fn read_err(dir: &std::path::Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let msg = read_idx(&path)
        .expect_err("corrupt file must not parse")
        .to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "'{msg}' does not name {}",
        path.display()
    );
    msg
}

fn sample() -> (Vec<usize>, Vec<u8>) {
    let dims = vec![3, 4, 5];
    let data: Vec<u8> = (0..60).map(|i| (i * 37 % 256) as u8).collect();
    (dims, data)
}

#[test]
fn u8_round_trip_plain_and_gzip() {
    let dir = TempDir::new("round");
    let (dims, data) = sample();
    for name in ["a-idx3-ubyte", "a-idx3-ubyte.gz"] {
        let path = dir.join(name);
        write_idx_u8(&path, &dims, &data).unwrap();
        let raw = std::fs::read(&path).unwrap();
        assert_eq!(raw.starts_with(&[0x1f, 0x8b]), name.ends_with(".gz"));
        let a = read_idx(&path).unwrap();
        assert_eq!(a.dims, dims);
        assert_eq!(a.data, IdxData::U8(data.clone()));
        // The same bytes parsed from memory.
        assert_eq!(parse_idx(&raw, name).unwrap(), a);
    }
    // The plain encoding byte for byte: magic 00 00 08 03, big-endian dims, data.
    let plain = encode_idx_u8(&dims, &data).unwrap();
    assert_eq!(
        &plain[..16],
        &[0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 5]
    );
    assert_eq!(&plain[16..], &data[..]);
    // gzip is detected by content, not by name.
    let gz = gzip(&plain);
    assert_eq!(parse_idx(&gz, "no-extension").unwrap().dims, dims);
    // A gzip file of several members (concatenated streams) is one file.
    let mut two = gzip(&plain[..10]);
    two.extend(gzip(&plain[10..]));
    assert_eq!(parse_idx(&two, "multi").unwrap().data, IdxData::U8(data));
}

#[test]
fn every_element_type_big_endian() {
    let header = |code: u8| vec![0u8, 0, code, 1, 0, 0, 0, 2];
    let with = |code: u8, body: &[u8]| [header(code), body.to_vec()].concat();
    let cases: Vec<(IdxType, Vec<u8>, IdxData)> = vec![
        (IdxType::U8, vec![7, 250], IdxData::U8(vec![7, 250])),
        (IdxType::I8, vec![0x7f, 0x80], IdxData::I8(vec![127, -128])),
        (
            IdxType::I16,
            vec![0x01, 0x02, 0xff, 0xfe],
            IdxData::I16(vec![258, -2]),
        ),
        (
            IdxType::I32,
            vec![0, 0, 1, 0, 0xff, 0xff, 0xff, 0xfd],
            IdxData::I32(vec![256, -3]),
        ),
        (
            IdxType::F32,
            [1.5f32.to_be_bytes(), (-0.25f32).to_be_bytes()].concat(),
            IdxData::F32(vec![1.5, -0.25]),
        ),
        (
            IdxType::F64,
            [3.0f64.to_be_bytes(), 1e-300f64.to_be_bytes()].concat(),
            IdxData::F64(vec![3.0, 1e-300]),
        ),
    ];
    for (ty, body, want) in cases {
        assert_eq!(IdxType::from_code(ty.code()), Some(ty));
        assert_eq!(body.len(), 2 * ty.size());
        let a = parse_idx(&with(ty.code(), &body), "typed").unwrap();
        assert_eq!(a.dims, vec![2]);
        assert_eq!(a.data.idx_type(), ty);
        assert_eq!(a.data, want, "{}", ty.name());
        if ty != IdxType::U8 {
            let msg = a.into_u8("typed.idx").unwrap_err().to_string();
            assert!(
                msg.contains("typed.idx") && msg.contains(ty.name()),
                "{msg}"
            );
        }
    }
}

#[test]
fn corrupt_files_are_errors_naming_the_file() {
    let dir = TempDir::new("corrupt");
    let (dims, data) = sample();
    let good = encode_idx_u8(&dims, &data).unwrap();

    let msg = read_err(&dir, "empty", &[]);
    assert!(msg.contains("0 bytes"), "{msg}");

    let mut bad = good.clone();
    bad[0] = 0x12;
    let msg = read_err(&dir, "bad-magic", &bad);
    assert!(msg.contains("magic 12 00 08 03"), "{msg}");

    let mut bad = good.clone();
    bad[2] = 0x0A;
    let msg = read_err(&dir, "bad-type", &bad);
    assert!(msg.contains("type code 0x0A"), "{msg}");

    let mut bad = good.clone();
    bad[3] = 0;
    let msg = read_err(&dir, "no-dims", &bad[..4]);
    assert!(msg.contains("0 dimensions"), "{msg}");

    let msg = read_err(&dir, "short-header", &good[..10]);
    assert!(
        msg.contains("need 12 bytes") && msg.contains("found 6"),
        "{msg}"
    );

    // Truncated data: expected and actual byte counts, plain and gzip.
    let msg = read_err(&dir, "truncated", &good[..good.len() - 7]);
    assert!(msg.contains("need 60 data bytes, found 53"), "{msg}");
    let msg = read_err(&dir, "truncated.gz", &gzip(&good[..good.len() - 7]));
    assert!(msg.contains("need 60 data bytes, found 53"), "{msg}");

    // Trailing bytes, plain and inside the gzip stream.
    let long = [good.clone(), vec![1, 2, 3]].concat();
    let msg = read_err(&dir, "trailing", &long);
    assert!(msg.contains("3 trailing bytes"), "{msg}");
    let msg = read_err(&dir, "trailing.gz", &gzip(&long));
    assert!(msg.contains("3 trailing bytes"), "{msg}");

    // Garbage after the gzip stream, a cut gzip stream, corrupt deflate data.
    let gz = gzip(&good);
    let msg = read_err(
        &dir,
        "garbage-after.gz",
        &[gz.clone(), b"junk".to_vec()].concat(),
    );
    assert!(msg.contains("gzip"), "{msg}");
    let msg = read_err(&dir, "cut.gz", &gz[..gz.len() / 2]);
    assert!(msg.contains("gzip"), "{msg}");
    let mut flipped = gz.clone();
    for b in &mut flipped[12..20] {
        *b ^= 0x5a;
    }
    read_err(&dir, "flipped.gz", &flipped);

    // Dimensions whose product overflows.
    let huge = [
        0u8, 0, 0x0E, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    ];
    let msg = read_err(&dir, "huge", &huge);
    assert!(msg.contains("overflow"), "{msg}");

    // A missing file is an IO error naming it.
    let missing = dir.join("does-not-exist.gz");
    let msg = read_idx(&missing).unwrap_err().to_string();
    assert!(msg.contains("does-not-exist.gz"), "{msg}");
}

#[test]
fn encode_rejects_bad_input() {
    assert!(encode_idx_u8(&[], &[]).is_err());
    assert!(encode_idx_u8(&[2, 3], &[0; 5]).is_err());
    assert!(encode_idx_u8(&[1usize << 33], &[]).is_err());
    assert_eq!(
        encode_idx_u8(&[0], &[]).unwrap(),
        vec![0, 0, 8, 1, 0, 0, 0, 0]
    );
}

/// A gzip bomb: a small header declaring a huge array, then a long run of zeros that compresses
/// to almost nothing. Refused from the header alone, before any data is decompressed, in a small
/// fraction of a second; and a run of zeros after valid data is counted only so far.
#[test]
fn gzip_bombs_are_refused_from_the_header() {
    let dir = TempDir::new("bomb");
    let zeros = vec![0u8; 8 << 20];
    let started = std::time::Instant::now();
    // 1 GiB declared (under the maximum), 8 MiB of zeros in a few KiB of gzip.
    let mut bomb = vec![0u8, 0, 0x08, 1];
    bomb.extend_from_slice(&(1u32 << 30).to_be_bytes());
    bomb.extend_from_slice(&zeros);
    let gz = gzip(&bomb);
    assert!(gz.len() < 64 << 10, "{}", gz.len());
    let msg = read_err(&dir, "bomb.gz", &gz);
    assert!(
        msg.contains("need 1073741824 data bytes") && msg.contains("compressed bytes hold at most"),
        "{msg}"
    );
    assert!(parse_idx(&gz, "bomb").is_err());
    // More than the stated maximum, whatever the file's size.
    let mut big = vec![0u8, 0, 0x0D, 2];
    big.extend_from_slice(&(1u32 << 16).to_be_bytes());
    big.extend_from_slice(&(1u32 << 15).to_be_bytes());
    let msg = read_err(&dir, "big.gz", &gzip(&big));
    assert!(
        msg.contains("8589934592 data bytes") && msg.contains(&MAX_IDX_DATA_BYTES.to_string()),
        "{msg}"
    );
    // A plain file declaring more than it holds is refused before reading.
    let msg = read_err(&dir, "short", &bomb[..1000]);
    assert!(
        msg.contains("need 1073741824 data bytes, found 992"),
        "{msg}"
    );
    // Valid data followed by 8 MiB of zeros inside the gzip stream.
    let (dims, data) = sample();
    let long = [encode_idx_u8(&dims, &data).unwrap(), zeros].concat();
    let msg = read_err(&dir, "trailing-bomb.gz", &gzip(&long));
    assert!(msg.contains("at least 1048576 trailing bytes"), "{msg}");
    assert!(started.elapsed().as_secs() < 5, "{:?}", started.elapsed());
}
