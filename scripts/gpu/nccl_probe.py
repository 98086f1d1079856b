"""Two processes, one per GPU, form vf-rl's BroadcastGroup over NCCL and broadcast 256 MiB
(rank 0 sees both GPUs and uses cuda:1, as the trainer does; rank 1 sees GPU 0 only, as a
vLLM worker does). Prints the time and whether the data arrived. GPU machines only."""
import os
import subprocess
import sys
import time

if len(sys.argv) == 1:
    from vf_rl.inference.communicator import free_port

    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "0", str(port)], env={**os.environ}),
             subprocess.Popen([sys.executable, __file__, "1", str(port)], env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"})]
    codes = [p.wait(timeout=120) for p in procs]
    print("probe exit codes", codes)
    sys.exit(max(codes))

import torch

from vf_rl.inference.communicator import BroadcastGroup

rank, port = int(sys.argv[1]), int(sys.argv[2])
device = torch.device("cuda", 1 if rank == 0 else 0)
if not os.environ.get("PROBE_NO_SET_DEVICE"):
    torch.cuda.set_device(device)
group = BroadcastGroup("127.0.0.1", port, rank, 2, "nccl", timeout_s=60, device=device)
n = 128 << 20
x = torch.arange(n, dtype=torch.bfloat16, device=device) if rank == 0 else torch.zeros(n, dtype=torch.bfloat16, device=device)
for i in range(3):
    start = time.perf_counter()
    group.broadcast(x)
    ok = bool(x[-1].item() != 0) if rank else True
    print(f"rank {rank}: broadcast {i} of 256 MiB in {time.perf_counter() - start:.4f} s, ok={ok}", flush=True)
group.close()
