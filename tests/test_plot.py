"""refimpl plot: the series handed to matplotlib equal their sources (telemetry CSV, route trace,
the audit's oracle), the drawn lines carry exactly those series, and a PNG is written; ``plot audit`` reads
the server responses ``refimpl audit`` reads (tests/data/responses)."""

import json
import os

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.model.trunk import load_model

PRED = [41, 212, 197, 248, 60]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.usefixtures("fixture_cache")


@pytest.fixture(scope="module", autouse=True)
def matplotlib_present():
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the machine
        if os.environ.get("CI") == "true":
            pytest.fail("matplotlib is required under CI=true (.ci/run installs the 'plot' extra)")
        pytest.skip("matplotlib is not installed (pip install -e '.[plot]')")


@pytest.fixture(scope="module")
def run_files(make_fixture, tmp_path_factory):
    """A predictable --mtp run's telemetry CSV, route trace and --json output."""
    d = tmp_path_factory.mktemp("plot")
    path = str(make_fixture("predictable", "f32"))
    csv, routes, js = d / "t.csv", d / "r.csv", d / "run.json"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["run", path, "--tokens", ",".join(map(str, PRED)), "-n", "24", "--mtp", "--csv", str(csv),
                     "--route-trace", str(routes), "--json"]) == 0
    js.write_text(buf.getvalue())
    return path, csv, routes, json.loads(buf.getvalue())


def _png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000


def test_telemetry_series_equals_the_run(run_files, tmp_path):
    from refimpl.oracle import plot

    _, csv, _, result = run_files
    s = plot.telemetry_series(csv)
    rounds = result["rounds"]
    assert s.accepted == [r["accepted"] for r in rounds] and s.drafted == [r["drafted"] for r in rounds]
    assert sum(s.tokens) == len(result["tokens"]) and sum(s.accepted) == result["stats"]["mtp_accepted"]
    per_pos = result["stats"]["accepted_per_pos"]  # rounds that accepted ≥ i+1; every round drafted 3 but the last ones
    tried = [sum(1 for r in rounds if r["drafted"] > i) for i in range(3)]
    assert s.per_position == pytest.approx([a / t for a, t in zip(per_pos, tried)])
    from refimpl.decode.telemetry import read_csv

    _, rows, _ = read_csv(csv)
    firsts = [r for i, r in enumerate(rows) if i == 0 or r["step"] != rows[i - 1]["step"]]
    assert s.mib_per_token == pytest.approx([int(r["bytes_read"]) / 2**20 / n for r, n in zip(firsts, s.tokens)])
    assert s.hit_rate == pytest.approx([int(r["stream_hits"]) / (int(r["stream_hits"]) + int(r["stream_misses"]))
                                        if int(r["stream_hits"]) + int(r["stream_misses"]) else None for r in firsts])
    fig = plot.draw_telemetry(s)
    ax = fig.axes
    assert [p.get_height() for p in ax[0].patches[len(s.accepted):]] == s.accepted  # the accepted bars
    assert [p.get_height() for p in ax[1].patches] == pytest.approx(s.per_position)
    assert np.allclose(ax[2].lines[0].get_ydata(), s.mib_per_token) and np.allclose(ax[3].lines[0].get_ydata(), s.hit_rate)
    out = tmp_path / "t.png"
    plot.save(fig, out)
    _png(out)


def test_route_counts_equal_the_trace(run_files, tmp_path):
    from refimpl.oracle import plot
    from refimpl.io.route_trace import read_route_trace

    _, _, routes, _ = run_files
    counts, labels = plot.route_counts(routes)
    rows = read_route_trace(routes)
    assert labels == ["layer 0", "layer 1", "layer 2", "layer 3", "head 4"]
    assert counts.sum() == sum(len(r["experts"]) for r in rows)
    for r_i, (head, il) in enumerate([(False, 0), (False, 1), (False, 2), (False, 3), (True, 4)]):
        sel = [e for r in rows if (r["kind"] == "head") == head and r["layer"] == il for e in r["experts"]]
        assert counts[r_i].tolist() == np.bincount(sel, minlength=counts.shape[1]).tolist()
    fig = plot.draw_routes(counts, labels)
    assert np.array_equal(fig.axes[0].images[0].get_array(), counts)
    out = tmp_path / "r.png"
    plot.save(fig, out)
    _png(out)


def test_audit_series_is_the_oracles_view(make_fixture, tmp_path):
    from refimpl.oracle import plot
    from refimpl.oracle.audit import Stream, audit
    from refimpl.decode.greedy import greedy

    model = load_model(make_fixture("tiny", "f32"))
    prompt = [11, 42, 7, 300, 5]
    clean = greedy(model, prompt, 16)
    bad = clean[:6] + [(clean[6] + 1) % 300] + clean[7:]
    s = plot.audit_series(model, prompt, bad)
    rep = audit(model, prompt, Stream("A", "x", "json", bad))
    assert s.divergence == rep.divergence.step == 6 and s.verdict == rep.verdict
    assert s.oracle[:7] == clean[:7] and s.deficit[:6] == [0.0] * 6
    assert s.deficit[6] == pytest.approx(rep.divergence.oracle.deficit(bad[6]))
    assert s.margin[6] == pytest.approx(rep.divergence.oracle.margin) and s.band[6] == pytest.approx(rep.divergence.oracle.threshold)
    fig = plot.draw_audit(s)
    ax = fig.axes[0]
    assert np.allclose(ax.lines[0].get_ydata(), s.margin) and np.allclose(ax.lines[1].get_ydata(), s.deficit)
    assert ax.lines[2].get_xdata()[0] == 6  # the divergence marker
    assert f"{bad[6]}\n({clean[6]})" in [t.get_text() for t in ax.texts]  # each differing step labelled: stream (oracle)
    worded = plot.draw_audit(s, piece=lambda t: f"w{t}").axes[0]
    assert f"'w{bad[6]}'\n('w{clean[6]}')" in [t.get_text() for t in worded.texts]  # with a tokenizer: the words
    out = tmp_path / "a.png"
    plot.save(fig, out)
    _png(out)


def test_cli_plot(run_files, tmp_path, capsys):
    path, csv, routes, result = run_files
    js = tmp_path / "s.json"
    js.write_text(json.dumps({"prompt_tokens": result["prompt_tokens"], "tokens": result["tokens"]}))
    for argv in (["telemetry", str(csv)], ["routes", str(routes)], ["audit", path, str(js)]):
        out = tmp_path / f"{argv[0]}.png"
        assert main(["plot", *argv, "--out", str(out)]) == 0
        _png(out)
    capsys.readouterr()
    assert main(["run", "-p", "And it came to pass", "-n", "8", "--json"]) == 0  # the default MODEL, builtin:kjv
    (tmp_path / "kjv.json").write_text(capsys.readouterr().out)
    assert main(["plot", "audit", str(tmp_path / "kjv.json"), "--out", str(tmp_path / "kjv.png")]) == 0  # MODEL optional
    assert "builtin:kjv" in capsys.readouterr().err
    _png(tmp_path / "kjv.png")
    assert main(["plot", "telemetry", str(routes), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("refimpl: error: ") and "not a telemetry CSV" in err


def test_cli_plot_audit_of_a_server_response(tmp_path, capsys):
    # llama-server's /completion answer on builtin:kjv (tests/data/responses): the ids are the stream, the
    # echoed prompt text is the prompt (tokenized by the model), as in refimpl audit
    from pathlib import Path

    data = Path(__file__).parent / "data" / "responses"
    out = tmp_path / "resp.png"
    assert main(["plot", "audit", str(data / "llama-server-ls.json"), "--out", str(out)]) == 0
    _png(out)
    # an OpenAI-style answer echoes no prompt: --prompt-tokens, or one line
    assert main(["plot", "audit", str(data / "llama-server-v1c.json"), "--out", str(tmp_path / "v1.png")]) == 2
    assert "plot audit needs the prompt: --prompt-tokens IDS" in capsys.readouterr().err.strip().splitlines()[-1]
    assert main(["plot", "audit", str(data / "llama-server-v1c.json"), "--prompt-tokens", "1063,356,473,289,600",
                 "--out", str(tmp_path / "v1.png")]) == 0
    _png(tmp_path / "v1.png")
    bad = json.loads((data / "llama-server-ls.json").read_text())
    bad["tokens"][2] = bad["completion_probabilities"][2]["id"] = 99999  # outside the 2048-token vocabulary
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    capsys.readouterr()
    assert main(["plot", "audit", str(tmp_path / "bad.json"), "--out", str(tmp_path / "bad.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("refimpl: error: ") and "token id 99999, outside the vocabulary [0, 2048)" in err
    assert not (tmp_path / "bad.png").exists()
