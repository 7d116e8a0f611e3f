"""What tools/setup_env.sh installs, decided in one testable place: the Python versions the pins
install on, and PyTorch's CUDA build (the default) or its CPU-only build.

Run by setup_env.sh with the Python it is given, before any .venv exists: standard library only, and
syntax that old Pythons still parse, so that a too-old Python gets the sentence and not a SyntaxError.

    python tools/setup_choice.py python [X.Y]       one sentence and exit 2 outside the supported range
    python tools/setup_choice.py choose [--cpu|--cuda12]
                                       the PyTorch build to install, and why (TRAINUP_CPU_ONLY=1)
    python tools/setup_choice.py requirements cpu|cu126
                                       requirements.txt with torch/torchvision as those builds
"""

import os
import re
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every pin of requirements.txt has a wheel for these (tests/test_setup.py asks PyPI's resolver for each):
# numpy 2.4.6 and pandas 3.1 have none for 3.10; torch 2.13.0 has none for 3.15.
PYTHON_OLDEST = (3, 11)
PYTHON_NEWEST = (3, 14)

CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's own index of CPU-only builds
# PyPI's torch 2.13 is a CUDA 13 build (drivers of the 580 series on); PyTorch's own index also builds it
# for CUDA 12.6 (drivers from the 525 series, Maxwell to Hopper), and for CUDA 12.9.
CUDA12_INDEX = "https://download.pytorch.org/whl/cu126"
INDEX = {"cpu": CPU_INDEX, "cu126": CUDA12_INDEX}
# Size of .venv on disk after each path (README "Set-up" says the same; a test checks they agree).
CUDA_SIZE = "5.4 GB"  # measured on a fresh clone
CPU_SIZE = "not measured here (only PyPI is reachable from the machine the course is built on)"


def version_text(version):
    return "%d.%d" % tuple(version[:2])


def python_sentence(version):
    """None when Python `version` (a tuple) can install the pins, else one sentence saying what to do."""
    version = tuple(version[:2])
    supported = "Python %s to %s" % (version_text(PYTHON_OLDEST), version_text(PYTHON_NEWEST))
    if PYTHON_OLDEST <= version <= PYTHON_NEWEST:
        return None
    why = (
        "too old for trainup's pinned packages (numpy 2.4.6 and pandas 3.1 need 3.11 or newer)"
        if version < PYTHON_OLDEST
        else "newer than trainup's pinned torch 2.13.0 has wheels for"
    )
    return (
        "Python %s is %s: install %s (for example `apt-get install python3.12 python3.12-venv` or "
        "`uv python install 3.12`) and run `PYTHON=python3.12 tools/setup_env.sh`"
        % (version_text(version), why, supported)
    )


def nvidia_driver_found(which=None, exists=os.path.exists):
    """An NVIDIA driver is installed: nvidia-smi is on PATH or the kernel module reports itself."""
    which = (
        which or shutil.which
    )  # looked up here: Python 2 has none, and must still reach python_sentence
    return bool(which("nvidia-smi")) or exists("/proc/driver/nvidia/version")


def choose(env, args, driver_found):
    """("cuda" or "cpu", the sentence the set-up prints). CPU-only only when asked for; without an
    NVIDIA driver it is offered, and the default stays PyPI's CUDA build, which also runs without a GPU."""
    if "--cuda12" in args:
        return "cu126", (
            "PyTorch: the CUDA 12.6 build of the same versions from %s (asked for with --cuda12: "
            "for an NVIDIA driver older than the 580 series, from the 525 series on)" % CUDA12_INDEX
        )
    if "--cpu" in args or env.get("TRAINUP_CPU_ONLY", "0") not in ("", "0"):
        how = "--cpu" if "--cpu" in args else "TRAINUP_CPU_ONLY=1"
        return "cpu", (
            "PyTorch: the CPU-only build of the same versions from %s (asked for with %s; "
            "size on disk %s); no GPU lesson will use a GPU" % (CPU_INDEX, how, CPU_SIZE)
        )
    if driver_found:
        return (
            "cuda",
            "PyTorch: PyPI's CUDA build (an NVIDIA driver is installed; about %s on disk)"
            % CUDA_SIZE,
        )
    return "cuda", (
        "PyTorch: PyPI's CUDA build (about %s on disk), which also runs without a GPU; no NVIDIA "
        "driver was found here, so `tools/setup_env.sh --cpu` (or TRAINUP_CPU_ONLY=1) would "
        "install the smaller CPU-only build instead" % CUDA_SIZE
    )


def cpu_requirements(text, build="cpu"):
    """requirements.txt's lines with torch and torchvision pinned to another build of the same versions,
    +cpu or +cu126 (the pair must match: PyPI's CUDA 13 torchvision does not load beside a +cpu torch)."""
    out, seen = [], set()
    for line in text.splitlines():
        m = re.match(r"^(torch|torchvision)\s*={2,3}\s*([0-9.]+)\s*$", line.strip())
        if m:
            seen.add(m.group(1))
            line = "%s==%s+%s" % (m.group(1), m.group(2), build)
        out.append(line)
    if seen != {"torch", "torchvision"}:
        raise ValueError("requirements.txt must pin torch and torchvision exactly")
    header = (
        "# Written by tools/setup_choice.py: requirements.txt with the +%s torch and torchvision\n"
        % build
    )
    return header + "\n".join(out) + "\n"


def main(argv):
    what = argv[0] if argv else ""
    if what == "python":
        version = (
            tuple(int(p) for p in argv[1].split(".")[:2]) if len(argv) > 1 else sys.version_info[:2]
        )
        sentence = python_sentence(version)
        if sentence:
            sys.stderr.write("error: %s.\n" % sentence)
            return 2
        return 0
    if what == "choose":
        flavour, sentence = choose(os.environ, argv[1:], nvidia_driver_found())
        print(flavour)
        print(sentence)
        return 0
    if what == "requirements" and argv[1:2] in (["cpu"], ["cu126"]):
        with open(os.path.join(ROOT, "requirements.txt")) as f:
            sys.stdout.write(cpu_requirements(f.read(), argv[1]))
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
