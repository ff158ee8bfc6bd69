import json, pathlib, subprocess, sys, time
sys.path.insert(0, ".")
from bench import loadgen
from launcher.config import StackConfig
from launcher.stack import Stack
from worker_svc.model.default import ensure_default_model
import random
model = str(ensure_default_model())
out = pathlib.Path("/tmp/xcheck")
cfg = StackConfig(model_path=model, http_port=0, cache_port=0, worker_port=0, scheduler_port=0, device="cpu", dtype="float32",
                  kv_tokens=65536, max_running_requests=256)
st = Stack(cfg, out / "logs", model_path=model)
(out / "logs").mkdir(exist_ok=True)
st.start()
try:
    scen = {"spec": {"backend": {"kind": "openai_http", "target": st.url, "request_format": "/v1/completions"},
                     "profile": {"kind": "concurrent", "streams": 16},
                     "tokenizer": {"kind": "huggingface_auto", "model": model},
                     "data": [{"kind": "synthetic_text", "prompt_tokens": 64, "output_tokens": 16}],
                     "constraints": [{"kind": "max_requests", "count": 96}]}}
    (out / "scen.json").write_text(json.dumps(scen))
    t = time.time()
    r = subprocess.run(["/tmp/lg/bin/guidellm", "run", "-c", str(out / "scen.json"), "--output", f"kind=json,path={out}/guidellm.json",
                        "--disable-progress"], capture_output=True, text=True)
    print("guidellm rc", r.returncode, time.time() - t)
    print(r.stdout[-6000:]); print(r.stderr[-3000:])
    rng = random.Random(0)
    payloads = [{"input_ids": [rng.randrange(100, 1000) for _ in range(64)],
                 "sampling_params": {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}} for _ in range(96)]
    s = loadgen.summarize(loadgen.run(st.url, payloads, 16))
    print("ours", json.dumps(s))
    (out / "ours.json").write_text(json.dumps(s, indent=1))
finally:
    st.stop()
