# Peer copies between NVIDIA GPUs in one OpenCL context: clEnqueueCopyBuffer on device 1's queue
# of a buffer last written on device 0, clEnqueueMigrateMemObjects, and a kernel on device 1
# reading it; bandwidths against a same-device copy. Correctness checked on the values.
import ctypes as C, sys, time, struct
cl = C.CDLL("libOpenCL.so.1")
for f in ["clCreateContext", "clCreateCommandQueue", "clCreateBuffer", "clCreateProgramWithSource", "clCreateKernel"]:
    getattr(cl, f).restype = C.c_void_p
n = C.c_uint(); cl.clGetPlatformIDs(0, None, C.byref(n)); plats = (C.c_void_p * n.value)(); cl.clGetPlatformIDs(n, plats, None)
plat = None
for p in plats:
    name = C.create_string_buffer(256); cl.clGetPlatformInfo(C.c_void_p(p), 0x0902, 256, name, None)
    if b"NVIDIA" in name.value: plat = C.c_void_p(p)
assert plat, "no NVIDIA platform"
nd = C.c_uint(); cl.clGetDeviceIDs(plat, 4, 0, None, C.byref(nd))
devs = (C.c_void_p * nd.value)(); cl.clGetDeviceIDs(plat, 4, nd, devs, None)
print("gpus", nd.value)
err = C.c_int()
ctx = C.c_void_p(cl.clCreateContext(None, nd.value, devs, None, None, C.byref(err))); assert err.value == 0, ("ctx", err.value)
qs = [C.c_void_p(cl.clCreateCommandQueue(ctx, C.c_void_p(devs[i]), 0, C.byref(err))) for i in range(nd.value)]
src = b"__kernel void touch(__global float* a, float v) { size_t i = get_global_id(0); a[i] = a[i] * 0.5f + v; }\n__kernel void sum(__global const float* a, __global float* o) { size_t i = get_global_id(0); o[i] = a[i] + 1.0f; }"
s = C.c_char_p(src)
prog = C.c_void_p(cl.clCreateProgramWithSource(ctx, 1, C.byref(s), None, C.byref(err)))
assert cl.clBuildProgram(prog, 0, None, b"", None, None) == 0
touch = C.c_void_p(cl.clCreateKernel(prog, b"touch", C.byref(err)))
ksum = C.c_void_p(cl.clCreateKernel(prog, b"sum", C.byref(err)))
SIZE = int(sys.argv[1]) if len(sys.argv) > 1 else 256 << 20
A = C.c_void_p(cl.clCreateBuffer(ctx, 1, SIZE, None, C.byref(err)))
B = C.c_void_p(cl.clCreateBuffer(ctx, 1, SIZE, None, C.byref(err)))
host = (C.c_float * (SIZE // 4))()
cl.clEnqueueWriteBuffer(qs[0], A, 1, 0, SIZE, host, 0, None, None)
g = (C.c_size_t * 1)(SIZE // 4)
def run_touch(q, v):
    cl.clSetKernelArg(touch, 0, 8, C.byref(A)); cl.clSetKernelArg(touch, 1, 4, C.byref(C.c_float(v)))
    assert cl.clEnqueueNDRangeKernel(q, touch, 1, None, g, None, 0, None, None) == 0
    cl.clFinish(q)
def timed(f):
    t = time.perf_counter(); f(); return time.perf_counter() - t
def copy_on(q):
    def f():
        assert cl.clEnqueueCopyBuffer(q, A, B, 0, 0, SIZE, 0, None, None) == 0; cl.clFinish(q)
    return f
def migrate_to(q):
    def f():
        assert cl.clEnqueueMigrateMemObjects(q, 1, C.byref(A), 0, 0, None, None) == 0; cl.clFinish(q)
    return f
def kernel_on(q):
    def f():
        cl.clSetKernelArg(ksum, 0, 8, C.byref(A)); cl.clSetKernelArg(ksum, 1, 8, C.byref(B))
        assert cl.clEnqueueNDRangeKernel(q, ksum, 1, None, g, None, 0, None, None) == 0; cl.clFinish(q)
    return f
gb = lambda t: f"{SIZE / t / 1e9:.1f} GB/s ({t * 1e3:.2f} ms)"
for name, mk in [("copy", copy_on), ("migrate", migrate_to), ("kernel", kernel_on)]:
    for dst in range(nd.value):
        ts = []
        for rep in range(4):
            run_touch(qs[0], float(rep))  # A's newest copy is on device 0
            ts.append(timed(mk(qs[dst])))
        print(f"{name} dev0 -> dev{dst}: best {gb(min(ts))}, first {gb(ts[0])}")
# correctness: after touch on dev0 with v=7, copy on dev1, read B on dev1
run_touch(qs[0], 7.0)
copy_on(qs[min(1, nd.value - 1)])()
out = (C.c_float * 4)()
cl.clEnqueueReadBuffer(qs[min(1, nd.value - 1)], B, 1, 0, 16, out, 0, None, None)
a0 = (C.c_float * 4)(); cl.clEnqueueReadBuffer(qs[0], A, 1, 0, 16, a0, 0, None, None)
print("check", list(out), list(a0))
