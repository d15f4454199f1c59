"""Fetch llama.cpp's HF -> GGUF converter from the llama-cpp-python sdist on PyPI,
and run it.

Only the converter script and the Python packages it imports (its own `gguf-py`
and `conversion/`) are extracted; nothing is built. The result lives in
third_party/llamacpp/ (gitignored) and is used by tests that convert tiny HF
models to GGUF with llama.cpp's own code, the independent writer.

    python -m ckptd.tools.fetch_llamacpp [--dest third_party]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
# Paths inside the sdist's vendor/llama.cpp/ that the converter needs at run time.
_KEEP = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "gguf-py/", "conversion/",
         "LICENSE")


def fetch_converter(dest: Path = Path("third_party")) -> Path:
    """Return the folder holding convert_hf_to_gguf.py and gguf-py/, downloading the
    sdist into dest/cache/ and extracting it only when not already there.

    Raises RuntimeError when the download fails (no network, PyPI unreachable)."""
    dest = Path(dest)
    out = dest / "llamacpp"
    if all((out / f).is_file() for f in ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py")) \
            and (out / "gguf-py" / "gguf").is_dir():
        return out
    sdist = _download(dest / "cache")
    _extract(sdist, out)
    return out


@dataclass(frozen=True)
class Conversion:
    """One run of convert_hf_to_gguf.py: model folder -> GGUF file."""
    model_dir: Path
    outfile: Path
    outtype: str = "f32"           # f32, f16, bf16, q8_0
    extra_args: tuple[str, ...] = ()


# Runs in the converter's interpreter: argv[1] = script, argv[2] = tokenizer pre name
# ('' to let the converter identify it), then (folder, outfile, outtype, extra args) per
# job, separated by '--next'. A trained-from-scratch tiny vocabulary has no entry in the
# converter's table of known tokenizers (identified by hashing a reference encoding), so
# the caller names its pre-tokenizer instead (and Jamba's converter, which wants a Llama
# vocabulary, writes it as GPT-2's); tensors go through the converter untouched.
_DRIVER = """
import runpy, sys
script, pre, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
if pre:
    from conversion.base import TextModel
    from conversion.jamba import JambaModel
    TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    # Jamba's converter reads only a Llama-style vocabulary: the tiny byte-level BPE is GPT-2's
    JambaModel.set_vocab = TextModel._set_vocab_gpt2
jobs, job = [], []
for a in rest:
    if a == "--next":
        jobs.append(job); job = []
    else:
        job.append(a)
jobs.append(job)
for j in jobs:
    sys.argv = [script, j[0], "--outfile", j[1], "--outtype", j[2], *j[3:]]
    runpy.run_path(script, run_name="__main__")
"""


def convert(root: Path, jobs: list[Conversion], tokenizer_pre: str | None = None,
            timeout: float = 600) -> None:
    """Run llama.cpp's converter (fetched into `root`) on each job, all in one Python
    process (its imports cost seconds). RuntimeError with the converter's output on failure."""
    if not jobs:
        return
    args: list[str] = []
    for i, j in enumerate(jobs):
        # the converter runs in `root`: relative paths would point there
        args += (["--next"] if i else []) + [str(Path(j.model_dir).resolve()),
                                            str(Path(j.outfile).resolve()), j.outtype,
                                            *j.extra_args]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(root / "gguf-py"), str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    res = subprocess.run([sys.executable, "-c", _DRIVER, str(root / "convert_hf_to_gguf.py"),
                          tokenizer_pre or "", *args],
                         capture_output=True, text=True, env=env, cwd=root, timeout=timeout)
    missing = [j.outfile for j in jobs if not Path(j.outfile).is_file()]
    if res.returncode != 0 or missing:
        raise RuntimeError(f"convert_hf_to_gguf.py failed (exit {res.returncode}):\n"
                           f"{(res.stdout + res.stderr)[-3000:]}")


def convert_lora(root: Path, base_dir: Path, lora_dir: Path, outfile: Path,
                 outtype: str = "f32", timeout: float = 600) -> None:
    """Run llama.cpp's convert_lora_to_gguf.py: a PEFT folder (adapter_config.json +
    adapter_model.safetensors) for the model in base_dir -> a GGUF adapter.
    RuntimeError with the converter's output on failure."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(root / "gguf-py"), str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    res = subprocess.run([sys.executable, str(Path(root).resolve() / "convert_lora_to_gguf.py"),
                          "--base", str(Path(base_dir).resolve()), "--outfile",
                          str(Path(outfile).resolve()), "--outtype", outtype,
                          str(Path(lora_dir).resolve())],
                         capture_output=True, text=True, env=env, cwd=root, timeout=timeout)
    if res.returncode != 0 or not Path(outfile).is_file():
        raise RuntimeError(f"convert_lora_to_gguf.py failed (exit {res.returncode}):\n"
                           f"{(res.stdout + res.stderr)[-3000:]}")


def _download(cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    found = _find_sdist(cache)
    if found:
        return found
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(cache), f"{PACKAGE}=={VERSION}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    found = _find_sdist(cache)
    if res.returncode != 0 or not found:
        raise RuntimeError(f"could not download the {PACKAGE}=={VERSION} sdist from PyPI "
                           f"(is the network up?): {res.stderr.strip()[-600:]}")
    return found


def _find_sdist(cache: Path) -> Path | None:
    names = (f"{PACKAGE}-{VERSION}.tar.gz", f"{PACKAGE.replace('-', '_')}-{VERSION}.tar.gz")
    for name in names:
        if (cache / name).is_file():
            return cache / name
    return None


def _extract(sdist: Path, out: Path) -> None:
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            # "<top>/vendor/llama.cpp/<rel>"
            parts = m.name.split("/", 3)
            if len(parts) < 4 or parts[1:3] != ["vendor", "llama.cpp"]:
                continue
            rel = parts[3]
            if not (m.isfile() and any(rel == k or rel.startswith(k) for k in _KEEP)):
                continue
            m.name = rel
            members.append(m)
        if not any(m.name == "convert_hf_to_gguf.py" for m in members):
            raise RuntimeError(f"{sdist} has no vendor/llama.cpp/convert_hf_to_gguf.py")
        tar.extractall(tmp, members=members, filter="data")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dest", type=Path, default=Path("third_party"))
    args = p.parse_args(argv)
    try:
        print(fetch_converter(args.dest))
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
