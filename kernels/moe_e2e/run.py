"""Run the end-to-end benchmark: every variant in a fresh process, interleaved, one result file.

    python -m moe_e2e.run --staged ~/moe-e2e --model qwen3-30b-a3b --out results/e2e \
        [--kinds fp8-static,compressed-tensors,fp8-dynamic,fp8-block] [--wheels official,patched]
        [--head-to-head patched:fp8-static:cutlass ...] [--max-num-seqs 64] [--repeats 3]
        [--gpus 0,1] [--tensor-parallel-size 2]

For each FP8 kind the wheels run one after the other (the order alternates from kind to kind),
then that kind's head-to-head variants (``WHEEL:KIND:BACKEND``: ``--moe-backend BACKEND``, or
``env=BACKEND`` for ``VLLM_FP8_MOE_BACKEND``; ``auto`` keeps the automatic choice; a fourth
field ``:FLAG,...`` turns on boolean engine arguments, e.g.
``official:fp8-static:auto:enable_flashinfer_autotune``).  Each variant gets a new process, new empty
Triton / Inductor / vLLM caches, and its whole log kept; the MoE backend it chose is read from
the engine's own "Using ... Fp8 MoE backend" line.  ``<out>.json`` is rewritten after every
variant, so a run cut short keeps what it measured; ``<out>.md`` is the report.  ``--resume``
continues such a file (same wheels, model and spec): what it measured is kept, failed and
missing variants run, so one benchmark can span several device sessions.  ``--model`` takes
several models, each written to ``<out>-<model>``.

Every record names its machine (the boot id): a GPU machine given back and lent again is
another host, whose CPU moved throughput by 10% and trace TTFT by 30% for one backend, so the
report compares engines that ran on one machine, and under ``--finish-before`` a kind's two
wheels start only when both can end in the call.

``--gpus`` splits the listed GPUs into slots of ``--tensor-parallel-size`` GPUs; consecutive
variants start together, one per slot, and the next group starts when all of them are done.  On
two GPUs a kind's two wheels run side by side, on the other GPU at the next kind and round, so a
difference between the GPUs shows up as spread, not as a bias for one wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import models, routing

KERNELS_DIR = Path(__file__).resolve().parents[1]
BACKEND_LINE = re.compile(
    r"Using (\S+) Fp8 MoE backend out of potential backends: (\[[^\]]*\])[,.]?\s*(?:because )?(.*)"
)
ATTENTION_LINE = re.compile(r"Using (\S+) attention backend")
JIT_LINE = re.compile(r"Triton kernel JIT compilation during inference: (\w+)")
LOG_FACTS = {
    "torch_compile_s": re.compile(r"torch\.compile took ([\d.]+) s in total"),
    "engine_init_s": re.compile(r"init engine \(.*\) took ([\d.]+) s"),
    "graph_capture_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "model_load_s": re.compile(r"Model loading took [\d.]+ GiB memory and ([\d.]+) seconds"),
    # The series' triton-moe-warmup: forward passes that compile the MoE launch configs.
    "triton_moe_warmup_s": re.compile(
        r"Warmed up Triton fused MoE for batches of .* in ([\d.]+) s"
    ),
}
# The environment each --routing gives the engines (vLLM's RoutingSimulatorRouter).
SIMULATED_ROUTING = "VLLM_MOE_ROUTING_SIMULATION_STRATEGY"
ROUTINGS = {
    "model": {},
    "uniform": {SIMULATED_ROUTING: "uniform_random"},
    "distinct": {SIMULATED_ROUTING: routing.STRATEGY},
}
DEFAULT_SPEC = {
    "max_model_len": 4096,
    "gpu_memory_utilization": 0.85,
    "seed": 0,
    "prefill_lens": [256, 1024, 4000],
    "decode_batches": [1, 4, 16, 64],
    "decode_tokens": 64,
    "repeats": 3,
    "throughput": {
        "requests": 128,
        "prompt_lens": [128, 512, 1024, 2048],
        "output_lens": [64, 128, 256],
    },
    "trace": {
        "seed": 7,
        "bursts": 30,
        "interval_s": 0.4,
        "burst_sizes": [1, 2, 3, 5, 8, 13, 21, 32],
        "min_prompt": 17,
        "max_prompt": 1500,
        "output_len": 4,
    },
}


def parse_log(text: str) -> dict:
    facts: dict = {"moe_backend": None, "moe_backend_candidates": None, "moe_backend_reason": None}
    for line in text.splitlines():
        found = BACKEND_LINE.search(line)
        if found and facts["moe_backend"] is None:
            facts["moe_backend"] = found.group(1)
            facts["moe_backend_candidates"] = found.group(2)
            facts["moe_backend_reason"] = found.group(3).strip().rstrip(".") or None
        found = JIT_LINE.search(line)
        if found:
            facts.setdefault("jit_during_inference", []).append(found.group(1))
        found = ATTENTION_LINE.search(line)
        if found and "attention_backend" not in facts:
            facts["attention_backend"] = found.group(1)
        for key, pattern in LOG_FACTS.items():
            found = pattern.search(line)
            if found and key not in facts:
                facts[key] = float(found.group(1))
    return facts


# NVLink multicast can take a shared host's GPUs out of service: NCCL, PyTorch and NVSHMEM keep
# it off, and vLLM's symmetric-memory all-reduce (which asks for it) is not used.
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
}


def variant_env(
    staged: dict,
    wheel: str,
    caches: Path,
    fp8_env: str | None,
    gpus: str | None = None,
    extra: dict | None = None,
) -> dict:
    env = dict(os.environ)
    for key in ("VLLM_FP8_MOE_BACKEND", "PYTHONPATH"):
        env.pop(key, None)
    env.update(NO_MULTICAST)
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(
                [staged["sites"][wheel], staged["sites"]["deps"], str(KERNELS_DIR)]
            ),
            "PYTHONUNBUFFERED": "1",
            "TRITON_CACHE_DIR": str(caches / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
            "VLLM_CACHE_ROOT": str(caches / "vllm"),
            "XDG_CACHE_HOME": str(caches / "xdg"),
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_LOGGING_LEVEL": "INFO",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "MOE_E2E_LAUNCHED": repr(time.time()),
        }
    )
    if has_flashinfer(staged):
        # FlashInfer JIT-builds its kernels with nvcc on first use: one workspace for every
        # variant, so only the first engine that needs a kernel pays for its build.
        env["FLASHINFER_WORKSPACE_BASE"] = str(Path(staged["sites"]["deps"]).parent / "flashinfer")
    # PyTorch's sampler for every engine: the same for both wheels, and with FlashInfer staged
    # its sampling kernels would be compiled on the GPU machine at the first engine's start.
    env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    if fp8_env:
        env["VLLM_FP8_MOE_BACKEND"] = fp8_env
    env.update(extra or {})
    if env.get(SIMULATED_ROUTING) == routing.STRATEGY:
        # vLLM registers the strategy in each of its processes from this entry point.
        plugin = routing.write_entry_point(caches.parent / "plugin")
        env["PYTHONPATH"] += os.pathsep + str(plugin)
    return env


def has_flashinfer(staged: dict) -> bool:
    return flashinfer_facts(staged) is not None


def start_engine(command: list[str], env: dict, log, timeout: float) -> int | str:
    """Run an engine process in its own session; its exit code, or "timeout" after killing
    the whole session (vLLM's engine-core and compile workers too, which would otherwise keep
    the GPU's memory from the next engine)."""
    proc = subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        return "timeout"


def run_variant(
    staged: dict, variant: dict, spec: dict, logs: Path, timeout: float, gpus: str | None = None
) -> dict:
    """Start one engine process for ``variant`` (on ``gpus``, a CUDA_VISIBLE_DEVICES value, when
    given) and return its record (result or failure)."""
    name = variant["name"]
    kind = models.FP8_KINDS[variant["kind"]]
    model_dir = Path(staged["models"]) / f"{variant['model']}-{variant['kind']}"
    with tempfile.TemporaryDirectory(prefix=f"moe-e2e-{name}-") as scratch:
        scratch = Path(scratch)
        full = {
            **spec,
            "model_dir": str(model_dir),
            "quantization": kind.engine_quantization,
            "moe_backend": variant.get("requested_backend"),
            "engine_flags": variant.get("engine_flags", []),
            "out": str(scratch / "result.json"),
            "profile_dir": str(scratch / "profile"),
        }
        (scratch / "spec.json").write_text(json.dumps(full, indent=2))
        log_path = logs / f"{name}.log"
        shared = deepgemm_cache_dir(variant, gpus)
        extra = {**variant.get("env", {}), **({"DG_JIT_CACHE_DIR": shared} if shared else {})}
        env = variant_env(
            staged, variant["wheel"], scratch / "caches", variant.get("fp8_env"), gpus, extra
        )
        if shared:  # whether this engine finds DeepGEMM's kernels built or builds them
            Path(shared).mkdir(parents=True, exist_ok=True)
            deepgemm_cache = "warm" if any(Path(shared).iterdir()) else "cold"
        started = time.time()
        with open(log_path, "w") as log:
            returncode = start_engine(
                [sys.executable, "-m", "moe_e2e.engine", str(scratch / "spec.json")],
                env,
                log,
                timeout,
            )
        text = log_path.read_text(errors="replace")
        record = {
            **variant,
            "gpus": gpus,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "machine": machine_id(),
            **({"deepgemm_cache": deepgemm_cache} if shared else {}),
            "returncode": returncode,
            "wall_s": time.time() - started,
            "log": log_path.name,
            **parse_log(text),
        }
        result_file = scratch / "result.json"
        if returncode == 0 and result_file.exists():
            record["result"] = json.loads(result_file.read_text())
        else:
            record["error_tail"] = text.splitlines()[-30:]
    return record


def variants(
    model: str, kinds: list[str], wheels: list[str], head_to_head: list[str], rounds: int = 1
) -> list[dict]:
    """The engines to start, in order: per round and FP8 kind the kind's wheels (the order
    alternating from kind to kind and from round to round, so neither wheel always runs first),
    then that kind's head-to-head backends, so the engines a comparison needs run back to back
    on one machine; head-to-heads of kinds not benchmarked end the round."""
    out = []
    for round_ in range(1, rounds + 1):
        suffix = f"-r{round_}" if round_ > 1 else ""  # so more rounds extend a result file
        extras = []
        for item in head_to_head:
            entry = {"model": model, "round": round_, **head_to_head_variant(item)}
            entry["name"] = f"{model}-{entry.pop('label')}{suffix}"
            extras.append(entry)
        for position, kind in enumerate(kinds):
            flip = (position + round_ - 1) % 2 == 1
            for wheel in reversed(wheels) if flip else wheels:
                out.append(
                    {
                        "name": f"{model}-{kind}-{wheel}{suffix}",
                        "model": model,
                        "kind": kind,
                        "wheel": wheel,
                        "round": round_,
                    }
                )
            out += [entry for entry in extras if entry["kind"] == kind]
        out += [entry for entry in extras if entry["kind"] not in kinds]
    return out


def pair_size(todo: list[dict], index: int) -> int:
    """2 when ``todo[index]`` and the next variant are one kind's two wheels (default backend,
    same round): they start only together, so a pair is never split across machines by a
    device call's end; else 1."""
    if index + 1 >= len(todo):
        return 1
    first, second = todo[index], todo[index + 1]
    same = all(first.get(k) == second.get(k) for k in ("model", "kind", "round"))
    default = not any(v.get(k) for v in (first, second) for k in ("requested_backend", "fp8_env"))
    return 2 if same and default and first["wheel"] != second["wheel"] else 1


HEAD_TO_HEAD = re.compile(
    r"(?P<wheel>\w+):(?P<kind>[\w-]+):(?P<backend>(?:env=)?\w+)(?::(?P<flags>\w+(?:,\w+)*))?"
)


def head_to_head_variant(item: str) -> dict:
    """``WHEEL:KIND:BACKEND[:FLAG,...]`` as a variant's fields (and ``label``, its name's
    tail); ValueError, saying the form, for anything else."""
    found = HEAD_TO_HEAD.fullmatch(item)
    if not found:
        raise ValueError(
            f"--head-to-head {item}: expected WHEEL:KIND:BACKEND or WHEEL:KIND:env=BACKEND, "
            "optionally :FLAG,... (boolean engine arguments to turn on)"
        )
    wheel, kind, backend, flags = found.group("wheel", "kind", "backend", "flags")
    entry: dict = {"kind": kind, "wheel": wheel}
    if backend.startswith("env="):
        entry["fp8_env"] = backend[4:]
    else:
        entry["requested_backend"] = backend
    label = f"{kind}-{wheel}-{backend.replace('=', '-')}"
    if flags:
        entry["engine_flags"] = flags.split(",")
        label += "-" + "-".join(entry["engine_flags"])
    return {**entry, "label": label}


def gpu_slots(gpus: str | None, tensor_parallel_size: int) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each slot: ``0,1,2,3`` at TP 2 is ``["0,1", "2,3"]``; without
    ``--gpus`` one slot that keeps the environment's GPUs."""
    if not gpus:
        return [None]
    ids = [g.strip() for g in gpus.split(",") if g.strip()]
    if len(set(ids)) != len(ids):
        raise ValueError(f"--gpus {gpus} names a GPU twice")
    if not ids or len(ids) % tensor_parallel_size:
        raise ValueError(
            f"--gpus {gpus} is not a multiple of --tensor-parallel-size {tensor_parallel_size}"
        )
    return [
        ",".join(ids[i : i + tensor_parallel_size])
        for i in range(0, len(ids), tensor_parallel_size)
    ]


def groups(todo: list[dict], slots: int) -> list[list[dict]]:
    """Variants that start together: consecutive ones, as many as there are slots."""
    return [todo[i : i + slots] for i in range(0, len(todo), slots)]


def run_group(
    staged: dict,
    group: list[dict],
    spec: dict,
    logs: Path,
    timeout: float,
    slots: list[str | None],
) -> list[dict]:
    if len(group) == 1:
        return [run_variant(staged, group[0], spec, logs, timeout, slots[0])]
    with ThreadPoolExecutor(max_workers=len(group)) as pool:
        futures = [
            pool.submit(run_variant, staged, variant, spec, logs, timeout, slot)
            for variant, slot in zip(group, slots[: len(group)], strict=True)
        ]
        records = [f.result() for f in futures]
    for record in records:
        record["alongside"] = [r["name"] for r in records if r is not record]
    return records


def machine_id() -> str:
    """This machine's identity until it reboots: engines of one pair compare fairly only on one
    machine (a lent GPU machine given back and taken again is another host, whose CPU moves
    start-up and the CPU-bound parts of serving)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return platform.node()


def cpu_model() -> str | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or None
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return f"{found.group(1).strip()} x{os.cpu_count()}" if found else None


def environment() -> dict:
    env = {"python": platform.python_version(), "machine": machine_id(), "cpu": cpu_model()}
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        env["gpu"] = smi.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        env["gpu"] = None
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch, triton; print(torch.__version__, triton.__version__)",
        ],
        capture_output=True,
        text=True,
    )
    if probe.returncode == 0:
        env["torch"], env["triton"] = probe.stdout.split()
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moe_e2e.run", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--staged", type=Path, default=Path("~/moe-e2e").expanduser())
    parser.add_argument(
        "--model",
        required=True,
        help=f"one or more of {', '.join(sorted(models.MODELS))}, comma-separated",
    )
    parser.add_argument("--kinds", default=",".join(models.FP8_KINDS))
    parser.add_argument("--wheels", default="official,patched")
    parser.add_argument(
        "--head-to-head",
        action="append",
        default=[],
        help="WHEEL:KIND:BACKEND (or WHEEL:KIND:env=BACKEND; BACKEND auto: the automatic "
        "choice), optionally :FLAG,... to turn on boolean engine arguments "
        "(e.g. official:fp8-static:auto:enable_flashinfer_autotune)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument(
        "--repeats",
        type=int,
        default=DEFAULT_SPEC["repeats"],
        help="decode repeats inside each engine",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="start every engine this many times (wheel order alternating)",
    )
    parser.add_argument("--decode-batches", default="1,4,16,64")
    parser.add_argument(
        "--profile-batches", default="", help="batch sizes to profile by kernel kind (e.g. 1,16)"
    )
    parser.add_argument(
        "--profile-prompts",
        default="",
        help="prompt lengths whose single prefill is profiled by kernel kind (e.g. 256,4000)",
    )
    parser.add_argument(
        "--gpus",
        default=None,
        help="GPU ids to use (e.g. 0,1): variants run side by side, one per slot of "
        "--tensor-parallel-size GPUs",
    )
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument(
        "--routing",
        choices=sorted(ROUTINGS),
        default="model",
        help="model: the dummy model's own router (dummy weights route almost every token to "
        "the same experts); distinct: each token's k experts a random k-subset, as a trained "
        "router spreads a batch (moe_e2e.routing, in vLLM's routing simulator); uniform: vLLM's "
        "own uniform_random, which can give a token one expert twice",
    )
    parser.add_argument(
        "--share-deepgemm-cache",
        action="store_true",
        help="one DeepGEMM kernel cache for every engine of a GPU slot (block FP8's dense "
        "layers: minutes of each engine's start-up); the report marks the engines that filled "
        "them",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per variant")
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="result path without suffix (with several models: <out>-<model> for each)",
    )
    parser.add_argument(
        "--start-before",
        type=float,
        default=None,
        metavar="SECONDS",
        help="start no variant once SECONDS have passed since the command began; what is "
        "left runs with --resume, and the exit code is 3",
    )
    parser.add_argument(
        "--finish-before",
        type=float,
        default=None,
        metavar="SECONDS",
        help="start no variant that would not end SECONDS after the command began (a device "
        "call's time limit), judged by the longest engine of the result file so far, or "
        "--engine-estimate before one has run, and stop one still running then; what is left "
        "runs with --resume (exit code 3)",
    )
    parser.add_argument(
        "--engine-estimate",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="an engine's wall time until one has run (default: 300; --finish-before); with "
        "--share-deepgemm-cache, until one has run with the cache filled",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the variants <out>.json already measured (same wheels and spec) and run the "
        "rest: one benchmark across several device sessions",
    )
    args = parser.parse_args(argv)

    if not (args.staged / "staged.json").is_file():
        parser.error(f"{args.staged} holds no staged bundle: run python -m moe_e2e.stage first")
    if args.tensor_parallel_size < 1:
        parser.error("--tensor-parallel-size must be at least 1")
    try:
        slots = gpu_slots(args.gpus, args.tensor_parallel_size)
    except ValueError as error:
        parser.error(str(error))
    staged = json.loads((args.staged / "staged.json").read_text())
    spec = {
        **DEFAULT_SPEC,
        "max_num_seqs": args.max_num_seqs,
        "tensor_parallel_size": args.tensor_parallel_size,
        "gpu_slots": slots,
        "shared_deepgemm_cache": args.share_deepgemm_cache,
        "routing": args.routing,
        "repeats": args.repeats,
        "decode_batches": [int(b) for b in args.decode_batches.split(",")],
        "profile_batches": [int(b) for b in args.profile_batches.split(",") if b],
        "profile_prompts": [int(n) for n in args.profile_prompts.split(",") if n],
    }
    command = " ".join(
        ["python", "-m", "moe_e2e.run", *(argv if argv is not None else sys.argv[1:])]
    )
    names = args.model.split(",")
    unknown = sorted(set(names) - set(models.MODELS))
    if unknown:
        parser.error(
            f"unknown model {', '.join(unknown)}: choose from {', '.join(sorted(models.MODELS))}"
        )
    for item in args.head_to_head:
        try:
            head_to_head_variant(item)
        except ValueError as error:
            parser.error(str(error))
    engine_env = dict(ROUTINGS[args.routing])  # what every engine of this run gets
    if args.share_deepgemm_cache:
        engine_env["DG_JIT_CACHE_DIR"] = str(args.staged.resolve() / "deep_gemm-cache")
    began = time.monotonic()
    clock = Deadlines(
        start_by=None if args.start_before is None else began + args.start_before,
        finish_by=None if args.finish_before is None else began + args.finish_before,
        engine_estimate=args.engine_estimate,
    )
    failed = left = False
    for model in names:
        out = args.out if len(names) == 1 else args.out.parent / f"{args.out.name}-{model}"
        report = new_report(command, staged, spec, model)
        if args.resume:
            try:
                report = resumed(report, result_path(out))
            except ValueError as error:
                parser.error(str(error))
        todo = variants(
            model, args.kinds.split(","), args.wheels.split(","), args.head_to_head, args.rounds
        )
        for variant in todo:
            variant["env"] = {**variant.get("env", {}), **engine_env}
        outcome = run_model(report, todo, staged, spec, out, args.timeout, slots, clock)
        failed |= outcome == "failed"
        left |= outcome == "left"
    return 1 if failed else 3 if left else 0


def result_path(out: Path, suffix: str = ".json") -> Path:
    return out.parent / f"{out.name}{suffix}"


def new_report(command: str, staged: dict, spec: dict, model: str) -> dict:
    return {
        "command": command,
        "vllm": staged["vllm"],
        "series_version": staged["series_version"],
        "series_commit": staged.get("series_commit"),
        "official_wheel": staged["official_wheel"],
        "patched_wheel": staged["patched_wheel"],
        "environment": environment(),
        "spec": spec,
        "model": model,
        "model_config": models.MODELS[model],
        "flashinfer": flashinfer_facts(staged),
        "variants": [],
    }


def flashinfer_facts(staged: dict) -> dict | None:
    """The FlashInfer the engines could import (None: not staged) and its prebuilt modules."""
    wheel = next(
        (n for n in staged.get("dependencies", []) if n.startswith("flashinfer_python-")), None
    )
    if wheel is None:
        return None
    builds = staged.get("flashinfer_aot_builds", {})
    return {
        "wheel": wheel,
        "prebuilt": {name: builds.get(name, {}) for name in staged.get("flashinfer_aot", [])},
    }


# What must be equal for a result file to be continued: the same wheels, model and measurement.
RESUME_KEYS = ("vllm", "series_version", "model", "model_config")


def resumed(report: dict, path: Path) -> dict:
    """``report`` continuing the one in ``path``: its measured variants kept, its failed ones
    dropped (they run again); a file measured with other wheels or another spec is refused."""
    if not path.is_file():
        return report
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot resume from {path}: {error}") from None
    differs = [key for key in RESUME_KEYS if earlier.get(key) != report[key]]
    for wheel in ("official_wheel", "patched_wheel"):
        if (earlier.get(wheel) or {}).get("sha256") != report[wheel]["sha256"]:
            differs.append(f"{wheel} sha256")
    placement = ("gpu_slots",)
    spec = {k: v for k, v in report["spec"].items() if k not in placement}
    # Files from before --routing existed measured the model's own router.
    earlier_spec = {"routing": "model", **earlier.get("spec", {})}
    if {k: v for k, v in earlier_spec.items() if k not in placement} != spec:
        differs.append("spec")
    if differs:
        raise ValueError(
            f"cannot resume {path}: its {', '.join(differs)} differ from this run's; "
            "give another --out"
        )
    kept = [v for v in earlier.get("variants", []) if "result" in v]
    sessions = earlier.get("sessions") or [
        {"environment": earlier.get("environment"), "command": earlier.get("command")}
    ]
    return {
        **report,
        "variants": kept,
        "sessions": [
            *sessions,
            {"environment": report["environment"], "command": report["command"]},
        ],
    }


def builds_deepgemm(variant: dict, filled: bool) -> bool:
    """Whether ``variant`` will build DeepGEMM's kernels into the shared cache (block FP8's dense
    layers: minutes that no later engine on the machine repeats)."""
    shared = bool(variant.get("env", {}).get("DG_JIT_CACHE_DIR"))
    return shared and not filled and variant.get("kind") == "fp8-block"


def built_deepgemm(record: dict) -> bool:
    """Whether the engine of ``record`` built DeepGEMM's kernels into the shared cache."""
    return record.get("kind") == "fp8-block" and record.get("deepgemm_cache") == "cold"


@dataclass(frozen=True)
class Deadlines:
    """When engines may start: not after ``start_by``, and only if they can end by
    ``finish_by`` (``time.monotonic()`` values; None: no limit).  An engine is expected to
    take as long as the longest one like it in the result file so far: a block engine that
    fills an empty shared DeepGEMM cache as long as the longest that filled it, every other
    engine as long as the longest that did not; ``engine_estimate`` before one has run."""

    start_by: float | None = None
    finish_by: float | None = None
    engine_estimate: float = 300.0

    def expected(self, report: dict, variant: dict, filled: bool) -> float:
        walls = [v for v in report["variants"] if v.get("wall_s") is not None]
        others = [v["wall_s"] for v in walls if not built_deepgemm(v)]
        if builds_deepgemm(variant, filled):
            built = [v["wall_s"] for v in walls if built_deepgemm(v)]
            return max(built or others, default=self.engine_estimate)
        return max(others, default=self.engine_estimate)

    def allow(
        self,
        report: dict,
        engines: list[dict],
        filled: list[bool] | None = None,
        side_by_side: bool = False,
    ) -> bool:
        """Whether ``engines`` may start now: one after the other (a kind's two wheels start
        only together), or side by side on several GPU slots; ``filled``: whether each will
        find its DeepGEMM cache built (default: none will)."""
        now = time.monotonic()
        if self.start_by is not None and now >= self.start_by:
            return False
        if self.finish_by is None:
            return True
        filled = filled or [False] * len(engines)
        times = [self.expected(report, v, f) for v, f in zip(engines, filled, strict=True)]
        need = max(times) if side_by_side else sum(times)
        return now + need <= self.finish_by

    def seconds_left(self) -> float:
        """Until ``finish_by``: an engine still running then is stopped (inf: no limit)."""
        if self.finish_by is None:
            return float("inf")
        return max(self.finish_by - time.monotonic(), 0.0)


def deepgemm_cache_dir(variant: dict, gpus: str | None) -> str | None:
    """The shared DeepGEMM cache of the engines in GPU slot ``gpus`` (None: not shared).  Each
    slot has its own, so engines side by side never build into one cache at once."""
    shared = variant.get("env", {}).get("DG_JIT_CACHE_DIR")
    if not shared or gpus is None:
        return shared
    return f"{shared}-gpu{gpus.replace(',', '-')}"


def deepgemm_filled(variant: dict, gpus: str | None) -> bool:
    """Whether ``variant`` finds its slot's shared DeepGEMM cache already built."""
    shared = deepgemm_cache_dir(variant, gpus)
    return bool(shared) and Path(shared).is_dir() and any(Path(shared).iterdir())


def filled_in_turn(engines: list[dict], filled: bool) -> list[bool]:
    """Whether each of ``engines``, run one after the other in one slot, finds the cache built:
    the first block engine that finds it empty builds it for the rest."""
    states = []
    for variant in engines:
        states.append(filled)
        filled = filled or builds_deepgemm(variant, filled)
    return states


def run_model(
    report: dict,
    todo: list[dict],
    staged: dict,
    spec: dict,
    out: Path,
    timeout: float,
    slots: list[str | None],
    clock: Deadlines = Deadlines(),
) -> str:
    """Run the variants ``report`` does not hold yet while ``clock`` allows another start;
    rewrite its JSON after every group and its Markdown at the end (a resumed file none of
    whose engines ran in this call is left as it was: this call's session is not its).
    "done" when every variant has a result, "left" when time left some for ``--resume``,
    else "failed"."""
    untouched = "sessions" in report  # resumed, and nothing run into it yet
    done = {v["name"] for v in report["variants"]}
    todo = [v for v in todo if v["name"] not in done]
    logs = out.parent / f"{out.name}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    left: list[str] = []
    side_by_side = len(slots) > 1
    for index, group in enumerate(groups(todo, len(slots))):
        if side_by_side:
            ahead = group
            filled = [
                deepgemm_filled(v, slot) for v, slot in zip(group, slots[: len(group)], strict=True)
            ]
        else:  # one slot: a kind's two wheels start only when both can end in time
            ahead = todo[index : index + pair_size(todo, index)]
            filled = filled_in_turn(ahead, deepgemm_filled(ahead[0], slots[0]))
        if left or not clock.allow(report, ahead, filled, side_by_side):
            left += [variant["name"] for variant in group]
            continue
        cut_at = clock.seconds_left()
        records = run_group(staged, group, spec, logs, min(timeout, cut_at), slots)
        if cut_at < timeout:  # stopped by --finish-before, not by its own timeout: not failed
            stopped = [r for r in records if r["returncode"] == "timeout"]
            left += [r["name"] for r in stopped]
            records = [r for r in records if r not in stopped]
            for record in stopped:
                print(
                    f"{record['name']}: stopped at --finish-before, left for --resume", flush=True
                )
        report["variants"].extend(records)
        untouched = untouched and not records
        result_path(out).write_text(json.dumps(report, indent=2) + "\n")
        for record in records:
            status = "ok" if "result" in record else f"FAILED ({record['returncode']})"
            where = f" on GPU {record['gpus']}" if record["gpus"] is not None else ""
            print(
                f"{record['name']}: {status}, backend {record['moe_backend']}{where}, "
                f"{record['wall_s']:.0f} s",
                flush=True,
            )
    from .report import markdown

    if untouched:
        print(f"{result_path(out)}: none of its engines ran in this call; left as it was")
    else:
        result_path(out).write_text(json.dumps(report, indent=2) + "\n")
        result_path(out, ".md").write_text(markdown(report))
    if not all("result" in r for r in report["variants"]):
        return "failed"
    if left:
        print(f"left for --resume (out of time): {', '.join(left)}", flush=True)
        return "left"
    return "done"


if __name__ == "__main__":
    sys.exit(main())
