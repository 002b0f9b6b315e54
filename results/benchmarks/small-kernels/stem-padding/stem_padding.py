# The stem convolution with its 3 input channels padded with zeros to 4 or 8: cuDNN's kernels, fp16/bf16, channels_last.
import torch, sys, json
torch.backends.cudnn.benchmark = True
res = []
for dtype in (torch.float16, torch.bfloat16):
  for stem, batch, side, k, s, p in (("imagenet", 256, 32, 7, 2, 3), ("imagenet", 1024, 32, 7, 2, 3), ("cifar", 512, 32, 3, 1, 1), ("cifar", 512, 16, 3, 1, 1)):
    for c in (3, 4, 8):
      x = torch.randn(batch, c, side, side, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
      w = torch.randn(64, c, k, k, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last).requires_grad_()
      g = torch.randn(batch, 64, (side + 2*p - k)//s + 1, (side + 2*p - k)//s + 1, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
      def fwd(): return torch.nn.functional.conv2d(x, w, None, s, p)
      def both():
        y = fwd(); (gw,) = torch.autograd.grad(y, w, g); return gw
      for f in (fwd, both):
        for _ in range(20): f()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        st = torch.cuda.Stream(); st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
          for _ in range(3): f()
        torch.cuda.current_stream().wait_stream(st)
        with torch.cuda.graph(graph):
          for _ in range(20): f()
        for _ in range(3): graph.replay()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(5):
          a.record(); graph.replay(); b.record(); b.synchronize(); times.append(a.elapsed_time(b) * 1000 / 20)
        times.sort()
        row = dict(dtype=str(dtype)[6:], stem=stem, batch=batch, side=side, channels=c, what=f.__name__, us=round(times[2], 2))
        res.append(row); print(json.dumps(row), flush=True)
