"""tools/cupti_trace/analyze.py on a synthetic trace: each replay's span, the per-kernel advances (how far a kernel
moved the replay's latest end) adding up to the span, a kernel hidden under another (a second graph branch) advancing
by 0, and a PDL overlap showing as a negative gap in the timeline. Needs no GPU and no ssmserve binary."""
import lzma
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
ANALYZE = ROOT / "tools" / "cupti_trace" / "analyze.py"
sys.path.insert(0, str(ANALYZE.parent))
import analyze  # noqa: E402

HEADER = "corr,graph_id,node_id,start_ns,end_ns,grid,block,regs,name\n"


def replay(corr, t0):
    # norm 0-3 us; gemm starts under it (PDL) and ends at 10; a branch kernel 4-8 (hidden); tail 9.5-12.
    rows = [(0, 3000, 1, 256, "norm"), (2000, 10000, 403, 128, "gemm"), (4000, 8000, 128, 512, "branch"),
            (9500, 12000, 1, 256, "tail")]
    return "".join(f"{corr},2,{i},{t0 + s},{t0 + e},{g},{b},32,{n}\n" for i, (s, e, g, b, n) in enumerate(rows))


def write(tmp_path, xz):
    text = HEADER + replay(7, 1_000_000) + replay(8, 1_050_000)
    p = tmp_path / ("t.csv.xz" if xz else "t.csv")
    if xz:
        with lzma.open(p, "wt") as f:
            f.write(text)
    else:
        p.write_text(text)
    return p


def test_advances_add_up_to_the_span_and_hidden_kernels_advance_zero(tmp_path):
    steps = analyze.read(str(write(tmp_path, xz=False)))
    assert list(steps) == ["7", "8"]
    out = subprocess.run([sys.executable, str(ANALYZE), str(write(tmp_path, xz=True)), "--timeline", "4"],
                         capture_output=True, text=True, check=True).stdout
    assert out.count(", span 12.0 us,") == 2, out
    # advance per replay: norm 3, gemm 7 (10 - 3), branch 0 (ends under gemm), tail 2 (12 - 10)
    table = out[out.index("per replay"):out.index("advance total")].splitlines()[2:]
    adv = {l.split()[3]: float(l.split()[2]) for l in table}
    assert adv == {"norm": 3.0, "gemm": 7.0, "branch": 0.0, "tail": 2.0}, out
    assert "advance total 12.0 us of span 12.0 us" in out, out
    # timeline: the gemm starts 1 us before the norm ends (PDL overlap), the tail 0.5 us before the gemm ends
    assert "-1.00  gemm" in out and "-0.50  tail" in out, out
