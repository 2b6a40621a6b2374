"""cpp/kernels/sm80/instances/ is written by tools/generate_attention_instances.py and committed; this fails when
the committed files no longer match what the generator writes (regenerate into a temporary folder and compare), and
checks that running the generator twice changes nothing."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "generate_attention_instances.py"
COMMITTED = ROOT / "cpp" / "kernels" / "sm80" / "instances"


def generate(out: Path) -> dict[str, str]:
    subprocess.run([sys.executable, str(TOOL), "--out", str(out)], check=True, timeout=60)
    return {p.name: p.read_text() for p in sorted(out.iterdir())}


def test_committed_instances_are_current(tmp_path):
    fresh = generate(tmp_path)
    committed = {p.name: p.read_text() for p in sorted(COMMITTED.iterdir())}
    hint = "(regenerate: python tools/generate_attention_instances.py)"
    assert sorted(committed) == sorted(fresh), hint
    stale = [name for name in fresh if committed[name] != fresh[name]]
    assert not stale, f"stale: {stale} {hint}"


def test_generator_is_idempotent(tmp_path):
    first = generate(tmp_path)
    (tmp_path / "left_over.cu").write_text("// no longer generated\n")
    assert generate(tmp_path) == first


def test_every_instance_file_is_listed_for_cmake(tmp_path):
    files = generate(tmp_path)
    listed = {line.strip() for line in files["instances.cmake"].splitlines() if line.strip().endswith(".cu")}
    assert listed == {name for name in files if name.endswith(".cu")}
    assert "decode_attention_d80_ku4_vf16.cu" in listed and "decode_attention_d256_ku8_vu4.cu" in listed
