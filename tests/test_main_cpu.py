"""``python -m distgemm`` without a GPU: the CPU reference executor on seeded inputs."""

import re

import distgemm.__main__ as cli


def run_main(capsys, monkeypatch, *argv):
    """Runs the CPU path on a small problem; returns (exit code, stdout, seeds of its inputs)."""
    seeds = []
    real = cli.reference_inputs

    def recording(plan, seed=0, **kw):
        seeds.append(seed)
        return real(plan, seed=seed, **kw)

    monkeypatch.setattr(cli, "reference_inputs", recording)
    rc = cli.main(["--cpu", "--tp", "2", "--m", "64", "--n", "128", "--k", "32", *argv])
    out, _ = capsys.readouterr()
    return rc, out, seeds


def test_cpu_path_uses_and_prints_the_given_seed(capsys, monkeypatch):
    rc, out, seeds = run_main(capsys, monkeypatch, "--seed", "1234")
    assert rc == 0, out
    assert seeds == [1234]
    assert "random inputs from seed 1234 (--seed)" in out
    assert "invariants: all hold" in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("relative Frobenius error")]
    errs = [float(e) for e in re.findall(r"\d\.\d\de[+-]\d+", line)]
    assert len(errs) == 2 and all(e < 1e-9 for e in errs), line


def test_cpu_path_default_seed_is_fixed(capsys, monkeypatch):
    rc, out, seeds = run_main(capsys, monkeypatch)
    assert rc == 0, out
    assert seeds == [0]
    assert "random inputs from seed 0 (--seed)" in out


def test_a_shape_above_the_available_memory_is_refused_before_allocating(capsys, monkeypatch):
    """The estimate is compared with what the machine has available (here 1 MiB): exit code 2,
    the numbers in one line, nothing printed or made before."""
    made = []
    monkeypatch.setattr(cli, "available_bytes", lambda: 2**20)
    monkeypatch.setattr(cli, "reference_inputs", lambda *a, **kw: made.append(a))
    rc = cli.main(["--cpu", "--tp", "2", "--m", "64", "--n", "128", "--k", "256"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and made == []
    (line,) = err.splitlines()
    need = re.search(r"needs about ([0-9.]+) MiB on the CPU reference executor", line)
    assert need and float(need.group(1)) > 1.0, line
    assert line.startswith("python -m distgemm: error: M=64 N=128 K=256 needs about ")
    assert line.endswith("above the 1.0 MiB this machine has available: pick smaller --m/--n/--k")
