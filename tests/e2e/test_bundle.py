"""The end-to-end benchmark without a GPU, before the engines run: the model configs, the
bundle (``moe_e2e.bundle`` from the wheels ``moe_patch.harness_wheels`` makes, and FlashInfer
built ahead of time by ``moe_e2e.flashinfer_aot``) and its staging on the GPU machine
(``moe_e2e.stage``), each checked byte for byte."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from fake_reports import fake_report
from moe_e2e import bundle, models, run, stage
from moe_e2e.report import markdown
from moe_patch import __version__


def test_every_model_and_kind_writes_a_config(tmp_path):
    for model in models.MODELS:
        for kind in models.FP8_KINDS:
            directory = models.write_model(tmp_path, model, kind)
            config = json.loads((directory / "config.json").read_text())
            assert config["architectures"] == models.MODELS[model]["architectures"]
            quant = config.get("quantization_config")
            if kind == "fp8-dynamic":
                assert quant is None and models.FP8_KINDS[kind].engine_quantization == "fp8"
            elif kind == "fp8-static":
                assert quant == {"quant_method": "fp8", "activation_scheme": "static"}
            elif kind == "fp8-block":
                assert quant["weight_block_size"] == [128, 128]
            else:
                assert quant["quant_method"] == "compressed-tensors"


def test_published_shapes_are_the_benchmarked_ones():
    qwen, mixtral = models.MODELS["qwen3-30b-a3b"], models.MODELS["mixtral-8x7b"]
    assert (qwen["num_experts"], qwen["num_experts_per_tok"]) == (128, 8)
    assert (qwen["hidden_size"], qwen["moe_intermediate_size"]) == (2048, 768)
    assert (mixtral["num_local_experts"], mixtral["num_experts_per_tok"]) == (8, 2)
    assert (mixtral["hidden_size"], mixtral["intermediate_size"]) == (4096, 14336)
    # Mixtral-8x22B's MoE is the harness's TP-4 shape at a quarter of its intermediate size
    from moe_kernels.measure import SHAPES

    big, shard = models.MODELS["mixtral-8x22b"], SHAPES["mixtral-8x22b-tp4"]
    assert (big["num_local_experts"], big["num_experts_per_tok"]) == (shard.experts, shard.topk)
    assert (big["hidden_size"], big["intermediate_size"]) == (shard.hidden, 4 * shard.intermediate)


def test_unknown_model_or_kind_is_refused():
    with pytest.raises(ValueError, match="unknown model"):
        models.model_config("llama", "fp8-block")
    with pytest.raises(ValueError, match="unknown FP8 kind"):
        models.model_config("mixtral-8x7b", "int4")


def _wheel(path: Path, members: dict[str, bytes], dist_info: str) -> Path:
    record = [f"{name},{bundle.record_digest(data)},{len(data)}" for name, data in members.items()]
    record.append(f"{dist_info}/RECORD,,")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture
def wheels(tmp_path):
    rng = __import__("random").Random(1)
    big = bytes(rng.randrange(256) for _ in range(50_000))
    official = {
        "vllm/__init__.py": b"version = 'official'\n",
        "vllm/big.so": big,
        "vllm/kernel.py": b"def kernel(): return 1\n",
        "vllm-1.0.dist-info/METADATA": b"Version: 1.0\n",
    }
    patched = dict(official)
    del patched["vllm-1.0.dist-info/METADATA"]
    patched["vllm/kernel.py"] = b"def kernel(): return 2\n"
    patched["vllm/new.json"] = b"{}\n"
    patched["vllm-1.0+moe.dist-info/METADATA"] = b"Version: 1.0+moe\n"
    return (
        _wheel(tmp_path / "official.whl", official, "vllm-1.0.dist-info"),
        _wheel(tmp_path / "patched.whl", patched, "vllm-1.0+moe.dist-info"),
    )


def test_segments_leave_out_exactly_the_dropped_member(wheels, tmp_path):
    official, _ = wheels
    segments, dropped = bundle.kept_segments(official, ("vllm/big.so",))
    assert dropped == ["vllm/big.so"]
    kept = sum(length for _, length in segments)
    with zipfile.ZipFile(official) as archive:
        info = archive.getinfo("vllm/big.so")
        start, end = bundle.member_span(archive, info, official.stat().st_size)
    assert kept == official.stat().st_size - (end - start)
    assert end - start > info.compress_size  # the local header goes with the data


def test_members_the_gpu_machines_python_never_loads_are_left_out(tmp_path):
    members = {
        f"vllm/third_party/deep_gemm/_C.cpython-{tag}-x86_64-linux-gnu.so": b"so"
        for tag in (310, 312, 314)
    }
    members["vllm/_C.abi3.so"] = b"abi3"
    members["vllm/entrypoints/serve/instrumentator/static/swagger-ui-bundle.js"] = b"js"
    wheel = _wheel(tmp_path / "v.whl", members, "vllm-1.0.dist-info")
    assert sorted(bundle.unused_members(wheel, "3.12")) == [
        "vllm/entrypoints/serve/instrumentator/static/swagger-ui-bundle.js",
        "vllm/third_party/deep_gemm/_C.cpython-310-x86_64-linux-gnu.so",
        "vllm/third_party/deep_gemm/_C.cpython-314-x86_64-linux-gnu.so",
    ]
    assert "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so" in (
        bundle.unused_members(wheel, "3.10")
    )


def test_dropping_a_member_the_wheel_lacks_is_an_error(wheels):
    with pytest.raises(SystemExit, match="no member"):
        bundle.kept_segments(wheels[0], ("vllm/absent.so",))


def test_overlay_holds_changed_members_and_dist_info(wheels):
    official, patched = wheels
    _, names = bundle.patched_overlay(official, patched)
    assert names == sorted(
        [
            "vllm/kernel.py",
            "vllm/new.json",
            "vllm-1.0+moe.dist-info/METADATA",
            "vllm-1.0+moe.dist-info/RECORD",
        ]
    )


def _payload_without_pip(monkeypatch, wheels, tmp_path, drop=("vllm/big.so",), prebuilt=()):
    official, patched = wheels
    segments, dropped = bundle.kept_segments(official, drop)
    overlay, changed = bundle.patched_overlay(official, patched)
    manifest = {
        "vllm": "1.0",
        "series_version": "0.0.0",
        "official_wheel": {
            "file": official.name,
            "sha256": bundle.sha256_file(official),
            "index_sha256": None,
            "size": official.stat().st_size,
            "segments": segments,
            "dropped": dropped,
        },
        "patched_wheel": {
            "file": patched.name,
            "sha256": bundle.sha256_file(patched),
            "version": "1.0+moe",
            "overlay_members": changed,
        },
        "dependencies": {},
    }
    payload = tmp_path / "payload.tar"
    manifest["flashinfer_aot"] = {library.name: bundle.sha256_file(library) for library in prebuilt}
    manifest["flashinfer_aot_builds"] = {
        library.name: json.loads(library.with_suffix(".json").read_text())
        for library in prebuilt
        if library.with_suffix(".json").is_file()
    }
    bundle.write_payload(payload, official, segments, overlay, [], manifest, prebuilt)
    out = tmp_path / "parts"
    out.mkdir(exist_ok=True)
    parts = bundle.split(payload, out, 20_000)
    (out / "bundle.json").write_text(
        json.dumps({"parts": parts, "payload_sha256": bundle.sha256_file(payload)})
    )
    monkeypatch.setattr(stage, "install_dependencies", lambda *a: None)
    return out


def test_stage_installs_both_sides_checked_against_their_records(monkeypatch, wheels, tmp_path):
    parts = _payload_without_pip(monkeypatch, wheels, tmp_path)
    into = tmp_path / "staged"
    summary = stage.stage(parts, into)
    official, patched = into / "site-official", into / "site-patched"
    assert (official / "vllm/kernel.py").read_bytes() == b"def kernel(): return 1\n"
    assert (patched / "vllm/kernel.py").read_bytes() == b"def kernel(): return 2\n"
    assert (patched / "vllm/new.json").exists() and not (official / "vllm/new.json").exists()
    assert not (official / "vllm/big.so").exists()  # dropped: never installed
    assert not (patched / "vllm-1.0.dist-info").exists()
    assert summary["patched_files_checked"] == 4  # __init__, kernel, new.json, METADATA
    # Bytecode compiled at staging, as pip installs, each side from its own source.
    (official_pyc,) = (official / "vllm/__pycache__").glob("kernel.*.pyc")
    (patched_pyc,) = (patched / "vllm/__pycache__").glob("kernel.*.pyc")
    assert official_pyc.read_bytes() != patched_pyc.read_bytes()
    assert stage.stage(parts, into) == summary  # done once, not redone


def test_stage_records_absolute_sites_from_a_relative_folder(monkeypatch, wheels, tmp_path):
    """Staged with ``--into staged`` from kernels/, the engines and the GPU test read the
    sites from other working directories (on the H200 a relative one made the test's
    engines fail to import vLLM)."""
    parts = _payload_without_pip(monkeypatch, wheels, tmp_path)
    monkeypatch.chdir(tmp_path)
    summary = stage.stage(parts, Path("staged"))
    for site in summary["sites"].values():
        assert Path(site).is_absolute() and Path(site).parent == tmp_path / "staged"
    assert Path(summary["sites"]["patched"], "vllm/kernel.py").is_file()


def test_stage_waits_for_missing_parts_and_refuses_a_damaged_one(monkeypatch, wheels, tmp_path):
    parts = _payload_without_pip(monkeypatch, wheels, tmp_path)
    held = tmp_path / "held"
    held.mkdir()
    (parts / "part-02").rename(held / "part-02")
    assert stage.stage(parts, tmp_path / "staged") is None
    data = bytearray((held / "part-02").read_bytes())
    data[10] ^= 0xFF
    (parts / "part-02").write_bytes(bytes(data))
    with pytest.raises(stage.StageError, match="does not match bundle.json"):
        stage.stage(parts, tmp_path / "staged")


def test_a_changed_member_fails_the_record_check(monkeypatch, wheels, tmp_path):
    official, patched = wheels
    target = tmp_path / "site"
    broken = tmp_path / "broken.whl"
    with zipfile.ZipFile(official) as src, zipfile.ZipFile(broken, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            dst.writestr(info.filename, b"tampered" if info.filename == "vllm/kernel.py" else data)
    with pytest.raises(stage.StageError, match="does not match the wheel's RECORD"):
        stage.extract_checked(broken, target, set())


def test_bundle_pins_every_engine_dependency():
    assert all("==" in requirement for requirement in bundle.ENGINE_DEPENDENCIES)
    names = [r.split("==")[0] for r in bundle.ENGINE_DEPENDENCIES]
    assert len(names) == len(set(names))
    assert hashlib.sha256(b"").hexdigest() == bundle.sha256_bytes(b"")
    assert io.BytesIO  # the helpers above write through in-memory buffers


def test_engine_packages_follow_the_release_where_it_excludes_the_list(tmp_path, monkeypatch):
    """The list's version where the release allows it; the release's own requirement where it
    does not (exact pin or range, markers judged for the GPU machine, extras ignored)."""
    monkeypatch.setattr(
        bundle,
        "ENGINE_DEPENDENCIES",
        ("cbor2==6.3.0", "compressed-tensors==0.15.0.1", "fastapi==0.165.0", "llguidance==1.3.0",
         "xgrammar==0.2.6", "sniffio==1.3.1"),
    )  # fmt: skip
    metadata = "\n".join([
        "Metadata-Version: 2.1",
        "Name: vllm",
        "Requires-Dist: cbor2",
        "Requires-Dist: compressed-tensors==0.17.0",
        "Requires-Dist: fastapi[standard]<0.137.0,>=0.133.0",
        'Requires-Dist: llguidance<1.8.0,>=1.7.0; platform_machine == "x86_64"',
        'Requires-Dist: xgrammar>=9; platform_machine == "ppc64le"',
        'Requires-Dist: sniffio>=2; extra == "audio"',
    ])  # fmt: skip
    wheel = tmp_path / "vllm-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm-1.0.dist-info/METADATA", metadata)
    assert bundle.engine_requirements(wheel) == [
        "cbor2==6.3.0",
        "compressed-tensors==0.17.0",
        "fastapi<0.137.0,>=0.133.0",
        "llguidance<1.8.0,>=1.7.0",
        "xgrammar==0.2.6",
        "sniffio==1.3.1",
    ]
    assert bundle.pinned_requirement(wheel, "compressed_tensors") == "compressed-tensors==0.17.0"


def test_bundle_builds_from_the_wheels_moe_patch_made_and_stages(
    fake_index, series_root, tmp_path, monkeypatch
):
    """``moe_patch.harness_wheels`` through the real wheel command (the synthetic release on
    the fake index), then ``bundle.build`` from its folder; only the engine's extra packages
    are left out (pip cannot fetch them here)."""
    from moe_patch.harness_wheels import harness_wheels
    from moe_patch.settings import Settings
    from wheel_support import add_wheel

    fake_index.add("1.0.0")
    add_wheel(fake_index, "1.0.0")
    made = harness_wheels(
        "1.0", tmp_path / "wheels", None, Settings.resolve(index_url=fake_index.url)
    )
    monkeypatch.setattr(bundle, "download_dependencies", lambda *args: [])
    out = tmp_path / "bundle"
    summary = bundle.build(tmp_path / "wheels", out, 1, "3.12", ())
    assert summary["vllm"] == made["vllm"] == "1.0.0" and summary["parts"]
    # The series is named by version and commit (this synthetic one lies outside git).
    assert (summary["series_version"], summary["series_commit"]) == (__version__, "unknown")
    assert summary["patched_wheel_sha256"] == made["patched"]["sha256"]
    assert summary["official_wheel_sha256"] == made["official"]["sha256"]
    assert made["official"]["sha256"] == made["official"]["index_sha256"]  # as the index says
    assert summary["patched_wheel_sha256"] != summary["official_wheel_sha256"]
    monkeypatch.setattr(stage, "install_dependencies", lambda *args: None)
    staged = tmp_path / "staged"
    assert stage.stage(out, staged)["series_commit"] == "unknown"
    kernel = "vllm/model_executor/layers/fused_moe/fused_moe.py"
    official = (staged / "site-official" / kernel).read_text()
    patched = (staged / "site-patched" / kernel).read_text()
    assert official != patched and "fused_moe_kernel" in patched


def test_bundle_refuses_wheels_it_was_not_given_as_made(wheels, tmp_path, capsys):
    """No wheels.json, or a wheel that is not the one it describes: one line, no bundle."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    with pytest.raises(SystemExit) as exit_:
        bundle.main(["--wheels", str(folder), "--out", str(tmp_path / "b")])
    assert "has no readable wheels.json" in str(exit_.value.code)
    assert "python -m moe_patch.harness_wheels" in str(exit_.value.code)
    official, patched = wheels
    for wheel in (official, patched):
        shutil.copy2(wheel, folder / wheel.name)
    described = {
        "vllm": "0.21.0", "series_version": "0.2.0", "series_commit": "abc1234",
        "official": {"file": official.name, "sha256": hashlib.sha256(official.read_bytes()).hexdigest()},
        "patched": {"file": patched.name, "sha256": "0" * 64},
    }  # fmt: skip
    (folder / "wheels.json").write_text(json.dumps(described))
    with pytest.raises(SystemExit) as exit_:
        bundle.build(folder, tmp_path / "b", 1, "3.12", ())
    assert f"{folder / patched.name} is missing or not the wheel" in str(exit_.value.code)
    assert not (tmp_path / "b").exists()


def test_a_prebuilt_flashinfer_module_lands_in_its_aot_folder(monkeypatch, wheels, tmp_path):
    library = tmp_path / "fused_moe_90.so"
    library.write_bytes(b"\x7fELF prebuilt")
    build = {"kernels": "fp8", "units_built": 32, "units_in_module": 181, "stubbed_symbols": 900}
    (tmp_path / "fused_moe_90.json").write_text(json.dumps(build))
    parts = _payload_without_pip(monkeypatch, wheels, tmp_path, prebuilt=(library,))
    with pytest.raises(stage.StageError, match="FlashInfer is not bundled"):
        stage.stage(parts, tmp_path / "without")

    def pip_installs_flashinfer(payload, manifest, target):
        (target / "flashinfer").mkdir(parents=True)

    parts = _payload_without_pip(monkeypatch, wheels, tmp_path, prebuilt=(library,))
    monkeypatch.setattr(stage, "install_dependencies", pip_installs_flashinfer)
    summary = stage.stage(parts, tmp_path / "staged")
    aot = tmp_path / "staged/site-deps/flashinfer/data/aot/fused_moe_90/fused_moe_90.so"
    assert aot.read_bytes() == b"\x7fELF prebuilt"
    assert summary["flashinfer_aot"] == ["fused_moe_90.so"]
    # How the module was built reaches every result file and its report.
    assert summary["flashinfer_aot_builds"] == {"fused_moe_90.so": build}
    staged = {**summary, "dependencies": ["flashinfer_python-0.6.8.post1-py3-none-any.whl"]}
    facts = run.flashinfer_facts(staged)
    assert facts == {
        "wheel": "flashinfer_python-0.6.8.post1-py3-none-any.whl",
        "prebuilt": {"fused_moe_90.so": build},
    }
    text = markdown({**fake_report([]), "flashinfer": facts})
    assert "FP8 x FP8 kernels only (32 of 181 translation units" in text
    assert run.flashinfer_facts({"dependencies": []}) is None
    assert "FlashInfer: not installed" in markdown(fake_report([]))


def test_a_damaged_prebuilt_module_is_refused_and_leaves_nothing(tmp_path):
    import hashlib
    import lzma

    payload, site = tmp_path / "payload", tmp_path / "site"
    (payload / "flashinfer-aot").mkdir(parents=True)
    (site / "flashinfer").mkdir(parents=True)
    packed = payload / "flashinfer-aot" / "fused_moe_90.so.xz"
    aot = site / "flashinfer/data/aot/fused_moe_90"
    packed.write_bytes(lzma.compress(b"\x7fELF other bytes", preset=1))
    manifest = {"flashinfer_aot": {"fused_moe_90.so": hashlib.sha256(b"\x7fELF").hexdigest()}}
    with pytest.raises(stage.StageError, match="does not match the manifest"):
        stage.install_prebuilt(payload, manifest, site)
    assert not any(aot.iterdir())
    packed.write_bytes(lzma.compress(b"\x7fELF other bytes", preset=1)[:-8])  # cut short
    with pytest.raises(stage.StageError, match="could not be unpacked"):
        stage.install_prebuilt(payload, manifest, site)
    assert not any(aot.iterdir())


def test_flashinfer_aot_needs_a_cuda_13_nvcc(monkeypatch, tmp_path, capsys):
    from moe_e2e import flashinfer_aot

    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    assert flashinfer_aot.main(["--out", str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("moe_e2e.flashinfer_aot: no nvcc under") and "\n" not in error
    nvcc = tmp_path / "cuda12/bin/nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda12"))
    assert flashinfer_aot.main(["--out", str(tmp_path / "out")]) == 1
    assert "nvcc 12.8" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bundle_refuses_a_missing_prebuilt_library(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        bundle.main(["--out", str(tmp_path / "b"), "--flashinfer-aot", str(tmp_path / "no.so")])
    assert exit_.value.code == 2 and "no.so: no such file" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def _fake_fused_moe_build(tmp_path: Path) -> Path:
    """A FlashInfer-like ninja file: helpers, one runner file per data-type pair, generated
    instantiation units of two data types."""
    sources = {
        "csrc/binding.cu": "// calls MoeGemmRunner<__nv_fp8_e4m3, __nv_fp8_e4m3> and others\n",
        "csrc/moe_gemm/moe_gemm_kernels_fp8_fp8.cu": (
            "template class MoeGemmRunner<__nv_fp8_e4m3, __nv_fp8_e4m3, half>;\n"
        ),
        "csrc/moe_gemm/moe_gemm_kernels_bf16_fp8.cu": (
            "template class MoeGemmRunner<__nv_bfloat16, __nv_fp8_e4m3, __nv_bfloat16>;\n"
        ),
        "gen/gemm_grouped_sm90_M128_group21.generated.cu": (
            "INSTANTIATE(Sm90, __nv_fp8_e4m3,\n  __nv_fp8_e4m3, half, 128, 16, 128);\n"
        ),
        "gen/gemm_grouped_sm90_M128_group0.generated.cu": "INSTANTIATE(Sm90, half, half, half);\n",
    }
    lines = [
        "rule compile\n  command = c++ -c $in -o $out",
        "rule link\n  command = c++ $in -o $out",
    ]
    objects = []
    for name, text in sources.items():
        source = tmp_path / name
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(text)
        objects.append(str(tmp_path / "build" / (source.stem + ".o")))
        lines.append(f"build {objects[-1]}: compile {source}")
    lines.append(f"build {tmp_path / 'build' / 'fused_moe_90.so'}: link {' '.join(objects)}")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "build.ninja").write_text("\n".join(lines) + "\n")
    return tmp_path / "build"


def test_an_fp8_only_build_leaves_out_exactly_the_other_data_types_kernel_units(tmp_path):
    from moe_e2e import flashinfer_aot

    build_dir = _fake_fused_moe_build(tmp_path)
    units, library = flashinfer_aot.ninja_units(build_dir)
    assert library.endswith("fused_moe_90.so") and len(units) == 5
    kept, left_out = flashinfer_aot.fp8_units(units)
    assert sorted(Path(o).stem for o in kept) == [
        "binding",
        "gemm_grouped_sm90_M128_group21.generated",
        "moe_gemm_kernels_fp8_fp8",
    ]
    assert sorted(Path(s).name for s in left_out) == [
        "gemm_grouped_sm90_M128_group0.generated.cu",
        "moe_gemm_kernels_bf16_fp8.cu",
    ]


@pytest.mark.skipif(not all(map(shutil.which, ("c++", "nm"))), reason="needs a C++ compiler and nm")
def test_stubs_stand_in_for_left_out_kernels_and_stop_loudly_when_called(tmp_path):
    from moe_e2e import flashinfer_aot

    kept = tmp_path / "kept.cpp"
    kept.write_text(
        "#include <cstdio>\n"
        "namespace tensorrt_llm { template <class T> struct Runner { void run(); };\n"
        '  extern template struct Runner<float>; void helper() { std::puts("ok"); } }\n'
        'extern "C" int fp8_path() { tensorrt_llm::helper(); return 8; }\n'
        'extern "C" void other_type() { tensorrt_llm::Runner<float>().run(); }\n'
    )
    subprocess.run(["c++", "-fPIC", "-c", str(kept), "-o", str(tmp_path / "kept.o")], check=True)
    missing = flashinfer_aot.missing_symbols([str(tmp_path / "kept.o")])
    assert missing == ["_ZN12tensorrt_llm6RunnerIfE3runEv"]  # not puts, not the defined helper
    stubs = tmp_path / "stubs.cpp"
    stubs.write_text(flashinfer_aot.stub_source(missing))
    library = tmp_path / "libmodule.so"
    subprocess.run(
        ["c++", "-shared", "-fPIC", str(tmp_path / "kept.o"), str(stubs), "-o", str(library)],
        check=True,
    )
    undefined = flashinfer_aot.nm_symbols([str(library)], "--dynamic", "--undefined-only")
    assert not [s for s in undefined if flashinfer_aot.TRTLLM_SYMBOL.match(s)]
    call = "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); print(lib.{}())"
    fine = subprocess.run(
        [sys.executable, "-c", call.format("fp8_path"), str(library)],
        capture_output=True,
        text=True,
    )
    assert fine.returncode == 0 and sorted(fine.stdout.split()) == ["8", "ok"]
    stopped = subprocess.run(
        [sys.executable, "-c", call.format("other_type"), str(library)],
        capture_output=True,
        text=True,
    )
    assert stopped.returncode != 0
    assert "has no _ZN12tensorrt_llm6RunnerIfE3runEv: rebuild with --kernels all" in stopped.stderr


def test_wheels_for_a_release_the_index_lacks_is_one_line_and_no_folder(
    fake_index, series_root, tmp_path, capsys
):
    from moe_patch import harness_wheels

    fake_index.add("1.0.0")
    out = tmp_path / "wheels"
    args = ["--vllm", "7.7", "--out", str(out), "--index-url", fake_index.url]
    assert harness_wheels.main(args) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("python -m moe_patch.harness_wheels: ") and "\n" not in error
    assert "7.7" in error and not out.exists()
