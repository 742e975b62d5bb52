set -o pipefail
export PYTHONUNBUFFERED=1 WEFT_CACHE_DIR=/tmp/weft-cache
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
timeout 120 python3 -m weft.benchmarks.sanitize_matmul 2>&1 | tail -20
timeout 200 python3 - <<'PY' 2>&1 | tail -30
import torch, time
from weft.kernels.matmul import Config, matmul
for variant in ("warp_specialized", "pipelined"):
    for (m,n,k) in [(4096,4096,4096)]:
        a = torch.randn(m,k,device="cuda",dtype=torch.bfloat16); b = torch.randn(k,n,device="cuda",dtype=torch.bfloat16)
        cfg = Config(128,256,64,3,variant=variant)
        try:
            out = matmul(a,b,config=cfg); ref = a.float()@b.float()
            err = ((out.float()-ref).abs().max()/ref.abs().max()).item()
            for _ in range(3): matmul(a,b,config=cfg)
            torch.cuda.synchronize()
            s=torch.cuda.Event(enable_timing=True); e=torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(20): matmul(a,b,config=cfg)
            e.record(); e.synchronize(); t=s.elapsed_time(e)/20*1e-3
            s.record()
            for _ in range(20): torch.matmul(a,b)
            e.record(); e.synchronize(); tc=s.elapsed_time(e)/20*1e-3
            f=2*m*n*k
            print(variant, "err", err, "weft TF", f/t/1e12, "cublas TF", f/tc/1e12, "ratio", tc/t)
        except Exception as ex:
            import traceback; traceback.print_exc()
PY
