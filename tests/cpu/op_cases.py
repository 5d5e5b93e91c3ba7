"""Shared by tests/cpu/test_op_arguments.py and test_ops_fuzz.py: running a snippet of calls into the CPU kernels
in a child process (a crash there is a signal in the return code, not a dead pytest), and the arguments of a
small wide_cpu::decode_step (one unrouted layer, float32, its weights by name) with an independent torch reference of
its result."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
PRELUDE = """\
import torch
from wide_export.cpu import ops as cpu
from wide_export.base.errors import WideError
from tests.cpu import op_cases
cpu.available()
"""


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_child(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`code` (after PRELUDE) in a fresh interpreter at the repository root; its outcome, a crash included."""
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


# A child that has imported torch and loaded the kernels once, then forks a grandchild per snippet (a few ms, not
# the seconds of a fresh interpreter): the grandchild's wait status comes back, a signal as a negative code. The
# child itself runs no kernel (no thread pool is started before a fork).
_ZYGOTE = PRELUDE + """
import json, os, sys, tempfile, traceback
for line in sys.stdin:
    with tempfile.TemporaryFile("w+") as sink:
        pid = os.fork()
        if pid == 0:
            os.dup2(sink.fileno(), 1), os.dup2(sink.fileno(), 2)
            code = 0
            try:
                exec(json.loads(line), dict(globals()))
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
        status = os.waitpid(pid, 0)[1]
        sink.seek(0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "out": sink.read()}), flush=True)
"""


class Zygote:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE], cwd=ROOT, env=_env(), text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)

    def run(self, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """`code` in a forked grandchild: returncode (negative: the signal that killed it), stdout (and stderr)."""
        import json
        import select

        self.proc.stdin.write(json.dumps(textwrap.dedent(code)) + "\n")
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            self.close()
            raise TimeoutError(f"a snippet ran past {timeout} s:\n{code}")
        got = json.loads(self.proc.stdout.readline())
        return subprocess.CompletedProcess([], got["rc"], got["out"], "")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


def describe(res: subprocess.CompletedProcess) -> str:
    how = f"killed by signal {-res.returncode}" if res.returncode < 0 else f"exit {res.returncode}"
    return f"the child process: {how}\nstdout:\n{res.stdout[-3000:]}\nstderr:\n{res.stderr[-3000:]}"


def outcome(call: str) -> str:
    """A snippet that runs `call` (an expression) and prints REFUSED|type|message or RETURNED."""
    return f"""
try:
    result = {call}
except (RuntimeError, ValueError, IndexError, WideError) as err:
    print("REFUSED", "WideError" if isinstance(err, WideError) else type(err).__name__, str(err), sep="|")
else:
    print("RETURNED")
"""


# one decode layer without routers, its weights by name (cpu/step.py: LAYER_WEIGHTS): q / k / v / o biases, no q / k
# norms, no routers; its geometry by name
def step_args(B=1, H=16, Hq=2, Hk=1, D=8, F_=24, V=10, cap=4, length=2, seed=0, cache_v=None):
    """The arguments of wide_cpu::decode_step (float32, one unrouted layer) as a dict, caches filled up to length:
    `weights` and `geometry` the layer's dicts (call_step makes the DecodeLayer of them), `force` its flag."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=0.2):
        return torch.randn(*shape, generator=g) * s

    NQ, NK = Hq * D, Hk * D
    w = {"input_layernorm.weight": 1 + r(H), "self_attn.q_proj.weight": r(NQ, H), "self_attn.q_proj.bias": r(NQ),
         "self_attn.k_proj.weight": r(NK, H), "self_attn.k_proj.bias": r(NK), "self_attn.v_proj.weight": r(NK, H),
         "self_attn.v_proj.bias": r(NK), "self_attn.o_proj.weight": r(H, NQ), "self_attn.o_proj.bias": r(H),
         "post_attention_layernorm.weight": 1 + r(H), "mlp.gate_proj.weight": r(F_, H),
         "mlp.up_proj.weight": r(F_, H), "mlp.down_proj.weight": r(H, F_)}
    ck = r(B, Hk, cap, D, s=1.0)
    cv = r(B, Hk, cap, D, s=1.0) if cache_v is None else cache_v
    ang = r(B, D, s=3.0)
    geometry = {"heads": Hq, "kv_heads": Hk, "head_dim": D, "attention_group_heads": 0, "ffn_group_size": 0}
    return dict(h=r(B, 1, H, s=1.0), weights=w, geometry=geometry, force=0, cache_k=[ck], cache_v=[cv],
                length=length, cos=ang.cos(), sin=ang.sin(), eps=1e-6, norm_w=1 + r(H), head_w=r(V, H),
                out=torch.empty(B, 1, V))


def call_step(a: dict):
    layer = torch.classes.wide_cpu.DecodeLayer(a["weights"], a["geometry"])
    return torch.ops.wide_cpu.decode_step(a["h"], [layer], [a["force"]], a["cache_k"], a["cache_v"], a["length"],
                                          a["cos"], a["sin"], a["eps"], a["norm_w"], a["head_w"], a["out"])


def _norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, cos, sin):  # x [B, heads, D], cos / sin [B, D]
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos[:, None] + torch.cat((-x2, x1), dim=-1) * sin[:, None]


def step_reference(a: dict):
    """The logits [B, 1, V] and the new cache rows (k, v [B, Hk, D]) of step_args' layer, in torch ops."""
    w, eps, geo = a["weights"], a["eps"], a["geometry"]
    ln1, ln2 = w["input_layernorm.weight"], w["post_attention_layernorm.weight"]
    wq, bq, wk, bk, wv, bv, wo, bo = (w[f"self_attn.{p}_proj.{k}"] for p in "qkvo" for k in ("weight", "bias"))
    wg, wu, wd = (w[f"mlp.{p}_proj.weight"] for p in ("gate", "up", "down"))
    Hq, Hk, D = geo["heads"], geo["kv_heads"], geo["head_dim"]
    h = a["h"][:, 0]
    B, n = h.shape[0], a["length"]
    x = _norm(h, ln1, eps)
    q = _rope(F.linear(x, wq, bq).view(B, Hq, D), a["cos"], a["sin"])
    k = _rope(F.linear(x, wk, bk).view(B, Hk, D), a["cos"], a["sin"])
    v = F.linear(x, wv, bv).view(B, Hk, D)
    keys = torch.cat([a["cache_k"][0][:, :, :n], k[:, :, None]], 2).repeat_interleave(Hq // Hk, 1)
    vals = torch.cat([a["cache_v"][0][:, :, :n], v[:, :, None]], 2).repeat_interleave(Hq // Hk, 1)
    p = torch.softmax((q[:, :, None] @ keys.transpose(-1, -2)) * D**-0.5, -1)
    o = (p @ vals)[:, :, 0].reshape(B, Hq * D)
    h1 = h + F.linear(o, wo, bo)
    y = F.silu(F.linear(_norm(h1, ln2, eps), wg)) * F.linear(_norm(h1, ln2, eps), wu)
    out = h1 + F.linear(y, wd)
    return F.linear(_norm(out, a["norm_w"], eps), a["head_w"])[:, None], k, v
