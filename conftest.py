"""pytest loads this whatever paths it is given: tests/suite_plugin.py, the suite's scheduling and
nbval's kernels, apply to a notebook run alone as to the whole suite (tests/conftest.py, only where
a test file is collected, holds the tests' fixtures)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))
pytest_plugins = ["suite_plugin"]
