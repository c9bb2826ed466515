import time, torch, tvm_ffi
print("torch", torch.__version__, "exchange api:", hasattr(torch.Tensor, "__dlpack_c_exchange_api__"))
nop = tvm_ffi.get_global_func("testing.nop")
for dev in ("cpu", "cuda"):
    ts = [torch.zeros(64, 16, device=dev) for _ in range(11)]
    for n in (0, 1, 6, 11):
        best = 1e9
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(5000):
                nop(*ts[:n])
            best = min(best, (time.perf_counter() - t0) / 5000)
        print(dev, n, "tensors", round(best * 1e6, 3), "us")
x = torch.zeros(64, device="cuda")
torch.cuda.synchronize()
for name, fn in (("torch add_ (one launch)", lambda: x.add_(1.0)), ("torch.cuda.current_stream()", torch.cuda.current_stream)):
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(5000):
            fn()
        best = min(best, (time.perf_counter() - t0) / 5000)
    torch.cuda.synchronize()
    print(name, round(best * 1e6, 3), "us")
