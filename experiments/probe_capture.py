"""Whether a quantizer's library load is refused inside a global-mode CUDA graph capture when
it is NOT wrapped in relaxed capture mode (the state before 889f8f9, found by review): loads
the experts quantizer through the ArtifactStore directly under torch.cuda.graph and prints
which way it went. tests/test_quantize_gpu.py's cold-capture test checks the fixed path.

    PYTHONPATH=. python experiments/probe_capture.py   # on the GPU, artifacts carried
"""

import torch

import runtime

gg = runtime.load("artifacts")
rt = gg.device_runtime(0)
q = gg.store.manifest.quantizer("experts", rt.arch)
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        gg.store.kernel(q, rt.device)  # the library load with no relaxed mode (before 889f8f9)
    print("load under global capture without relaxed mode: ok")
except Exception as e:
    print("load under global capture without relaxed mode failed:", type(e).__name__, str(e)[:300])
