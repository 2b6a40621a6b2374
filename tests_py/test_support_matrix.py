"""docs/support.md is generated from the kernel registries by tools/gen_support_matrix.py; this fails when the
committed file no longer matches what the registries say (a kernel added, a can_run rule changed)."""
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "gen_support_matrix.py"


def test_support_matrix_is_current():
    r = subprocess.run([sys.executable, str(TOOL), "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr + "\n(regenerate: python tools/gen_support_matrix.py)"
