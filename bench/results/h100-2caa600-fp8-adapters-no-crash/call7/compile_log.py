"""Log which Triton kernels compile during which generate() of bench/offline_throughput.py
(run from the repo root with offline_throughput's arguments; a fresh TRITON_CACHE_DIR makes
every compile show). A diagnostic of one lease, kept beside its output."""

import runpy
import sys
import time

from triton import knobs

from loraplex.engine import LLM

T0 = time.time()


def stamp(msg: str) -> None:
    print(f"[{time.time() - T0:8.2f}] {msg}", file=sys.stderr, flush=True)


def on_compile(*args: object, **kwargs: object) -> bool:
    stamp("compile " + str(kwargs.get("repr", "?"))[:60])
    return False  # go on compiling


def logged_generate(self: LLM, *args: object, **kwargs: object) -> object:
    stamp("generate start")
    out = plain_generate(self, *args, **kwargs)
    stamp("generate end")
    return out


knobs.runtime.jit_cache_hook = on_compile
plain_generate = LLM.generate
LLM.generate = logged_generate  # type: ignore[method-assign]
sys.argv = ["bench/offline_throughput.py", *sys.argv[1:]]
sys.path.insert(0, "bench")
runpy.run_path("bench/offline_throughput.py", run_name="__main__")
