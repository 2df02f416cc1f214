"""The run report and the data-scaling curve, from one real `eaglekit run` on a tiny target.

The run (module fixture) has every stage, a bench with HF generate and prompt categories, and
`scaling: {fractions: [0.5, 1.0]}`; it first stops before the scaling slices (`--stop-before
scaling`), then finishes. The page is checked in headless Chromium: it renders, the browser logs no
console error or warning and asks for nothing but the page itself, and every figure is drawn.
CI sets EAGLEKIT_REQUIRE_CHROMIUM=1, so there a missing browser fails instead of skipping.
"""

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from chromium import find_chromium, load_page
from eaglekit.cli import main
from eaglekit.report.html import FIGURES, write_report

PROMPTS = [
    "Count from one to ten.",
    "What is the capital of France?",
    "Write a function that adds two numbers.",
    "Hello! How can I help you today?",
    "Solve 12 * 7.",
    "Tell me about the quick brown fox.",
    "Name three colours.",
    "Why is the sky blue?",
    "Spell the word cat.",
    "What comes after Monday?",
    "Give me a word that rhymes with moon.",
    "Is seven a prime number?",
]
BENCH = [
    {"id": "w1", "category": "writing", "turns": ["Write a haiku about rain."]},
    {"id": "w2", "category": "writing", "turns": ["Describe a cat in one sentence.", "Now a dog."]},
    {"id": "m1", "category": "math", "turns": ["What is 6 times 7?"]},
]


def recipe_file(tmp: Path, target: Path) -> Path:
    prompts, bench = tmp / "prompts.jsonl", tmp / "bench.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "turns": [p]}) + "\n" for i, p in enumerate(PROMPTS)))
    bench.write_text("".join(json.dumps(r) + "\n" for r in BENCH))
    recipe = {
        "name": "tiny",
        "target": str(target),
        "device": "cpu",
        "prompts": {"source": [str(prompts)], "validation-fraction": 0.2},
        "generate": {"max-new-tokens": 12, "batch-size": 6},
        "features": {"batch-tokens": 512},
        "train": {
            "draft-vocab-size": 64,
            "allow-smaller-vocab": True,
            "ttt-steps": 2,
            "epochs": 4,
            "batch-tokens": 256,
            "val-every": 3,
            "log-every": 2,
            "no-progress": True,
        },
        "export": {"formats": ["vllm"]},
        "doctor": {"engine": "vllm", "probe": "builtin", "num-prompts": 2, "max-new-tokens": 8},
        "bench": {"mode": "chain", "k": 2, "max-new-tokens": 8, "prompts": str(bench)},
        "scaling": {"fractions": [0.5, 1.0]},
    }
    path = tmp / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def run(tiny_target_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    recipe, out = recipe_file(tmp, tiny_target_dir), tmp / "run"
    assert main(["run", "--recipe", str(recipe), "--out", str(out), "--stop-before", "scaling"]) == 0
    stopped = (out / "report.html").read_text()
    assert main(["run", "--recipe", str(recipe), "--out", str(out)]) == 1  # a tiny random draft: doctor fails
    return {"out": out, "recipe": recipe, "stopped_html": stopped, "tmp": tmp}


@pytest.fixture(scope="session")
def chromium():
    exe = find_chromium()
    if exe is None:
        if os.environ.get("EAGLEKIT_REQUIRE_CHROMIUM") == "1":
            pytest.fail("EAGLEKIT_REQUIRE_CHROMIUM=1 but no chromium on PATH: apt-get install -y chromium")
        pytest.skip("no chromium on PATH (apt-get install -y chromium); CI sets EAGLEKIT_REQUIRE_CHROMIUM=1")
    return exe


# What the test reads from the rendered page (the page itself has no script).
PROBE = """JSON.stringify({
  title: document.title,
  scripts: document.scripts.length,
  figures: [...document.querySelectorAll('figure[data-figure]')].map(f => {
    const svg = f.querySelector('svg'); const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
    return {name: f.dataset.figure, status: f.dataset.status, plot: f.classList.contains('plot'),
            width: box.width, height: box.height,
            marks: f.querySelectorAll('svg circle, svg rect.bar, svg polyline').length,
            caption: (f.querySelector('figcaption') || {}).innerText || ''};
  }),
  doctorRows: document.querySelectorAll('table.doctor tr').length,
  external: [...document.querySelectorAll('[src], [href]')].map(e => e.getAttribute('src') || e.getAttribute('href')),
  text: document.body.innerText,
})"""


def figures_of(html: str) -> dict[str, str]:
    """data-figure -> data-status, read from the HTML text."""
    return dict(re.findall(r'<figure class="[a-z]+" data-figure="([a-z0-9-]+)" data-status="([a-z ]+)"', html))


def test_scaling_trains_every_slice_as_its_own_run(run):
    out = run["out"]
    state = json.loads((out / "pipeline.json").read_text())
    assert [k for k in state["stages"] if k.startswith("scaling-")] == [
        "scaling-0.5-train",
        "scaling-0.5-bench",
        "scaling-1-train",
        "scaling-1-bench",
    ]
    first = json.loads((out / "draft" / "manifest.json").read_text())  # the main draft
    main_steps = first["steps"]["done"]
    samples = []
    for fraction in ("0.5", "1"):
        manifest = json.loads((out / "scaling" / f"frac-{fraction}" / "draft" / "manifest.json").read_text())
        assert manifest["stage"] == "train" and manifest["complete"]
        assert manifest["config"]["train_fraction"] == float(fraction)
        assert manifest["config"]["max_steps"] == main_steps == manifest["steps"]["done"]  # the same step budget
        assert manifest["counts"]["val_samples"] == first["counts"]["val_samples"] > 0  # the same validation
        samples.append(manifest["counts"]["train_samples"])
        assert (out / "scaling" / f"frac-{fraction}" / "bench" / "results.json").is_file()
    assert 0 < samples[0] < samples[1] == first["counts"]["train_samples"]
    table = json.loads((out / "scaling" / "scaling.json").read_text())
    assert [r["fraction"] for r in table["rows"]] == [0.5, 1.0]
    assert all(
        r["status"] == "done" and r["walk_tau"] is not None and r["bench_tau"] is not None for r in table["rows"]
    )
    assert table["rows"][0]["tokens"] < table["rows"][1]["tokens"]
    assert table["rows"][0]["passes"] > table["rows"][1]["passes"] > 0  # half the data, the same steps: seen more often
    assert "| 0.5 | done |" in (out / "scaling" / "scaling.md").read_text()
    assert (out / "scaling" / "scaling.svg").read_text().count("<circle") >= 4
    assert "scaling: walk tau by share of the data" in state["summary"]
    assert f"report: {out / 'report.html'}" in state["summary"]


def test_a_rerun_skips_the_slices_and_an_interrupted_slice_resumes(run, caplog):
    out, recipe = run["out"], run["recipe"]
    before = json.loads((out / "pipeline.json").read_text())
    main(["run", "--recipe", str(recipe), "--out", str(out)])
    after = json.loads((out / "pipeline.json").read_text())
    assert {k: v["seconds"] for k, v in after["stages"].items()} == {
        k: v["seconds"] for k, v in before["stages"].items()
    }
    # A slice recorded as started but not finished is run again with --resume from its trainer state.
    after["stages"]["scaling-1-train"]["status"] = "running"
    (out / "pipeline.json").write_text(json.dumps(after))
    caplog.set_level("INFO")
    main(["run", "--recipe", str(recipe), "--out", str(out)])
    assert any("--resume" in r.getMessage() and "frac-1/draft" in r.getMessage() for r in caplog.records)
    assert any(r.getMessage().startswith("resumed") and "frac-1" in r.getMessage() for r in caplog.records)
    assert json.loads((out / "pipeline.json").read_text())["stages"]["scaling-1-train"]["status"] == "done"


def test_report_renders_in_chromium_with_every_figure(run, chromium, tmp_path):
    out = run["out"]
    page = load_page(chromium, out / "report.html", user_data_dir=tmp_path / "profile", evaluate=PROBE, screenshot=True)
    assert page.errors == [] and page.console == []
    assert page.requests == [(out / "report.html").resolve().as_uri()]  # nothing fetched but the page
    facts = json.loads(page.value)
    assert facts["scripts"] == 0 and facts["external"] == []
    drawn = {f["name"]: f for f in facts["figures"]}
    assert set(drawn) == set(FIGURES)
    for name, fig in drawn.items():
        assert fig["plot"] and fig["status"] == "done", (name, fig)
        assert fig["width"] > 100 and fig["height"] > 100 and fig["marks"] > 0, (name, fig)
        assert "command eaglekit" in fig["caption"] and "date 20" in fig["caption"], (name, fig["caption"])
    report = json.loads((out / "doctor" / "report.json").read_text())
    assert facts["doctorRows"] == len(report["checks"]) + 1
    text = facts["text"]
    assert "writing" in text and "math" in text  # tau by prompt category
    assert "HF generate" in text and "speedup over HF generate" in text
    assert "walk tau" in text and "FAILED" in text
    probe = report["probe"]  # the probe says what it measured in
    assert f"{probe['dtype']} on {probe['device']}" in text, probe
    assert page.screenshot[:8] == b"\x89PNG\r\n\x1a\n" and len(page.screenshot) > 20_000


def test_the_report_of_a_stopped_run_shows_scaling_as_not_run(run):
    figures = figures_of(run["stopped_html"])
    assert set(figures) == set(FIGURES)
    assert figures["scaling-tau"] == figures["scaling-acc0"] == "not run"
    assert "the run stopped before stage scaling" in run["stopped_html"]
    assert all(status == "done" for name, status in figures.items() if not name.startswith("scaling"))


def test_report_labels_unfinished_and_missing_parts(run, tmp_path):
    """A killed training stage is unfinished, a missing bench is missing: nothing is drawn for them
    from elsewhere."""
    copy = tmp_path / "run"
    shutil.copytree(run["out"], copy, ignore=shutil.ignore_patterns("*.safetensors", "target", "features"))
    state = json.loads((copy / "pipeline.json").read_text())
    state["stages"]["train"]["status"] = "running"
    (copy / "pipeline.json").write_text(json.dumps(state))
    (copy / "bench" / "results.json").unlink()
    shutil.rmtree(copy / "scaling" / "frac-1")
    (copy / "scaling" / "scaling.json").unlink()
    html = write_report(copy).read_text()
    figures = figures_of(html)
    assert figures["loss"] == figures["accuracy"] == figures["tau"] == "unfinished"
    assert figures["speed"] == figures["tau-by-category"] == "missing"
    assert "missing: no bench/results.json" in html
    assert figures["scaling-tau"] == "unfinished"  # slices recorded, no summary
    # The acceptance figure keeps what exists (training and the doctor), without the bench's bars.
    assert figures["acceptance"] != "missing" and 'data-series="bench' not in html


def test_report_refuses_a_folder_without_a_run(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "holds no pipeline.json and no stage output" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nope")]) == 2


def test_the_chromium_check_catches_errors_and_network_use(chromium, tmp_path):
    """The checks above can fail: a page with a console error, an exception and an external image."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>bad</title></head><body>'
        '<img src="http://example.invalid/x.png"><script>console.error("boom"); nope();</script>'
        "</body></html>"
    )
    page = load_page(chromium, bad, user_data_dir=tmp_path / "profile")
    assert "console.error: boom" in page.errors
    assert any(e.startswith("exception: ReferenceError") for e in page.errors)
    assert "http://example.invalid/x.png" in page.requests


def test_a_bench_and_doctor_older_than_the_draft_are_marked_stale(run, tmp_path):
    """Found 2026-12-04: a rerun that trained again but did not bench again showed the earlier
    draft's bench in the run's summary and the report, as if it were this draft's."""

    from eaglekit.artifacts import BENCH_RESULTS, MANIFEST, RUN_BENCH, RUN_DRAFT
    from eaglekit.pipeline.run import summarize
    from eaglekit.report.collect import collect

    copy = tmp_path / "run"
    shutil.copytree(run["out"], copy)
    assert collect(copy).bench.status == "done" and "predates" not in summarize(copy)[1]
    later = (copy / RUN_BENCH / BENCH_RESULTS).stat().st_mtime + 60
    os.utime(copy / RUN_DRAFT / MANIFEST, (later, later))  # the draft was trained again
    data = collect(copy)
    assert data.bench.status == "stale" and data.doctor.status == "stale"
    text = summarize(copy)[1]
    assert "bench:" in text and "predates this draft" in text and "speedup" not in text


def test_a_bench_or_doctor_result_without_its_manifest_is_unfinished(run, tmp_path):
    """A result file is written before its manifest: without the manifest the stage did not finish
    writing, and the report must not call the part done (found 2026-12-04)."""
    from eaglekit.artifacts import MANIFEST, RUN_BENCH, RUN_DOCTOR
    from eaglekit.report.collect import collect

    copy = tmp_path / "run"
    shutil.copytree(run["out"], copy)
    (copy / RUN_BENCH / MANIFEST).unlink()
    (copy / RUN_DOCTOR / MANIFEST).unlink()
    data = collect(copy)
    assert data.bench.status == "unfinished" and "did not finish writing" in data.bench.note
    assert data.doctor.status == "unfinished" and "did not finish writing" in data.doctor.note


def test_the_benchs_drift_warning_reaches_the_run_summary_and_the_report(run, tmp_path):
    """Found 2026-12-06 (issue 42): the bench's "plain runs differ by N %" warning was only in its log;
    `eaglekit run`'s summary and report.html showed the speedup without it. The real run's bench,
    with a warning written into its results as the bench writes one."""
    from eaglekit.artifacts import BENCH_RESULTS, RUN_BENCH
    from eaglekit.pipeline.run import summarize
    from eaglekit.report.collect import collect
    from eaglekit.report.html import render

    copy = tmp_path / "run"
    shutil.copytree(run["out"], copy)
    path = copy / RUN_BENCH / BENCH_RESULTS
    results, stamp = json.loads(path.read_text()), path.stat().st_mtime
    assert results["summary"]["per_prompt_speedup"]["median"] > 0  # the spread beside the headline

    def with_warning(warning):
        if warning is None:  # this busy machine may have given the real bench a warning of its own
            results["summary"]["timing"].pop("warning", None)
        else:
            results["summary"]["timing"]["warning"] = warning
        path.write_text(json.dumps(results))
        os.utime(path, (stamp, stamp))  # not newer than it was: not stale
        return summarize(copy)[1], render(collect(copy))

    text, html = with_warning(None)
    assert "bench warning:" not in text and "data-warning" not in html
    text, html = with_warning("a turn's two plain runs differ by 42% (median)")
    assert "bench warning: a turn's two plain runs differ by 42% (median)" in text
    assert 'data-warning="drift"' in html and "differ by 42% (median)" in html
