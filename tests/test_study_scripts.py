"""The study's helper scripts: the protocol's decision rule in the report, and the AIC-gate simulation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from train_helpers import REPO_ROOT

from simcse_weince.compare import report as study_report

sys.path.insert(0, str(REPO_ROOT / "scripts" / "study"))  # negatives_study

TEXT_METRICS = ("stsb_dev", "stsb_test", "sts_avg")  # the text cells' (TEXT_CELLS.metric_labels)


def test_decision_rule_is_the_protocols():
    assert study_report.decision([0.01, 1.2]) == "beats the baseline"
    assert study_report.decision([-1.2, -0.01]) == "worse than the baseline"
    assert study_report.decision([-0.5, 0.7]) == "no difference at this size"
    assert study_report.decision([0.0, 0.7]) == "no difference at this size"  # an interval touching 0 decides nothing
    assert study_report.decision(None).startswith("no interval")


def test_report_reads_a_comparison(tmp_path):
    from simcse_weince.compare import format_markdown, summarize

    runs = [{"variant": v, "seed": s, "stsb_dev": 80.0 + s, "stsb_test": 75.0 + s + (0.5 if v == "weince" else 0),
             "sts_avg": 70.0} for v in ("infonce", "weince") for s in (1, 2, 3)]  # fmt: skip
    summary = {"baseline": "infonce", "seeds": [1, 2, 3], "runs": runs, "git_commit": "abcdef0123",
               "metrics": {"stsb_dev": "STS-B dev (best)", "stsb_test": "STS-B test", "sts_avg": "STS avg"},
               "lambda_curves": {"weince": [{"step": 1, "lambda_mean": 0.2}, {"step": 2, "lambda_mean": 0.4}]},
               "cell_wall_time_seconds": 7200.0, **summarize(runs, "infonce", TEXT_METRICS)}  # fmt: skip
    (tmp_path / "comparison.json").write_text(json.dumps(summary))
    (tmp_path / "comparison.md").write_text(format_markdown(summary))
    text = study_report.study_report(tmp_path)
    assert "| weince | 3 |" in text
    assert "`weince` − `infonce`, STS-B test: +0.50 [+0.50, +0.50]; beats the baseline." in text
    assert "| `weince` | 0.300 |" in text  # mean λ over the steps
    # no run records its training commit (an older summary): only the summarising checkout is known, and named so
    assert "6 runs summarised at commit `abcdef0`; their wall times (whole runs) add up to 2.00 h." in text
    # runs that record the commit that trained them: that one is named, not the summarising checkout's
    summary["runs"] = [{**run, "training_commit": "1234567890"} for run in runs]
    (tmp_path / "comparison.json").write_text(json.dumps(summary))
    assert "6 runs trained at commit `1234567`;" in study_report.study_report(tmp_path)
    summary["runs"][0]["training_commit"] = "fedcba9876"  # runs trained at two commits: both named
    (tmp_path / "comparison.json").write_text(json.dumps(summary))
    assert "6 runs trained at commits `1234567`, `fedcba9`;" in study_report.study_report(tmp_path)
    against = study_report.study_report(tmp_path, ("weince",))  # the second baseline: the same pairs, the other sign
    assert "`infonce` − `weince`, STS-B test: -0.50 [-0.50, -0.50] (0/0/3); worse than the baseline." in against


def test_aic_gate_simulation_shows_the_gate_open_whatever_the_domain():
    # the README's explanation of the study rests on this: the method's per-anchor AIC gate opens for nearly every
    # anchor of Gumbel- and Weibull-domain rows alike, while the Weibull slope recovers a true Weibull tail's index
    out = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "study" / "aic_gate_null.py"), "--rows", "400"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    table = [line for line in out.splitlines() if line.startswith("| ") and "negatives drawn" not in line]
    rows = [line.split("|")[1:-1] for line in table]
    assert {row[1].strip() for row in rows} == {"Gumbel", "Weibull"} and len(rows) == 6
    for name, _domain, _delta_aic, open_share, beta_hat in rows:
        assert float(open_share.strip().rstrip("%")) >= 95.0, name
        if "β = " in name:  # a Weibull row: the slope estimates its index
            true_beta = float(name.split("β = ")[1].rstrip(") "))
            assert abs(float(beta_hat) - true_beta) <= 0.25 * true_beta, name


def test_report_skips_a_variant_without_pairs_against_either_baseline(tmp_path):
    # a variant run on other seeds has no pairs: no line (not a crash) against the baseline or a second one
    from simcse_weince.compare import format_markdown, summarize

    cells = (("infonce", (1, 2)), ("weince", (1, 2)), ("other-seeds", (7,)))
    runs = [{"variant": v, "seed": s, "stsb_dev": 80.0, "stsb_test": 75.0 + s, "sts_avg": 70.0}
            for v, seeds in cells for s in seeds]  # fmt: skip
    summary = {"baseline": "infonce", "seeds": [1, 2, 7], "runs": runs, "git_commit": None,
               "metrics": {"stsb_dev": "STS-B dev (best)", "stsb_test": "STS-B test", "sts_avg": "STS avg"},
               **summarize(runs, "infonce", TEXT_METRICS)}  # fmt: skip
    (tmp_path / "comparison.json").write_text(json.dumps(summary))
    (tmp_path / "comparison.md").write_text(format_markdown(summary))
    text = study_report.study_report(tmp_path, ("weince",))
    assert "`weince` − `infonce`, STS-B test: +0.00 [+0.00, +0.00]; no difference at this size." in text
    assert "`infonce` − `weince`, STS-B test: +0.00 [+0.00, +0.00] (0/2/0); no difference at this size." in text
    assert "other-seeds` −" not in text


def test_negatives_study_trend_and_pooled_analysis(tmp_path):
    """Study 2's analysis on made-up runs whose differences are known: WEINCE +0.1 at 64, +0.1 + 0.2·(seed - 5) at
    1024, so its trend per seed is 0.2·(seed - 5); the pooled batch-64 analysis adds Study 1's seeds."""
    import negatives_study
    from scipy import stats

    def runs(seeds, weince_gain):
        def score(variant, seed):
            gain = weince_gain(seed) if variant.startswith("weince") else 0.0
            return 79.0 + 0.01 * seed + gain + (0.4 if variant.endswith("hardness") else 0.0)

        variants = negatives_study.STUDY_VARIANTS
        return [{"variant": v, "seed": s, "stsb_test": score(v, s)} for v in variants for s in seeds]

    seeds = [6, 7, 8, 9, 10]
    by_batch = {64: runs(seeds, lambda s: 0.1), 1024: runs(seeds, lambda s: 0.1 + 0.2 * (s - 5))}
    by_batch[1024] = [run for run in by_batch[1024] if not (run["variant"] == "infonce" and run["seed"] == 10)]
    study1 = [run for run in runs([1, 2, 3, 4, 5], lambda s: -0.3) if run["variant"] != "weince-hardness"]
    analysis = negatives_study.analyse(by_batch, study1)

    at_64 = analysis["per_batch"]["64"]["weince - infonce"]
    assert at_64["mean"] == pytest.approx(0.1) and at_64["wins"] == 5 and at_64["seeds"] == seeds
    # weince-hardness against the peer: the same WEINCE gain, the hardness term cancels in the pair
    assert analysis["per_batch"]["64"]["weince-hardness - infonce-hardness"]["mean"] == pytest.approx(0.1)
    trend = analysis["trend"]["weince - infonce"]
    assert trend["seeds"] == [6, 7, 8, 9]  # seed 10 lacks its 1024 baseline: no trend pair
    expected = [0.2 * (s - 5) for s in (6, 7, 8, 9)]
    assert trend["mean"] == pytest.approx(sum(expected) / 4)
    interval = stats.ttest_1samp(expected, 0).confidence_interval(0.95)
    assert trend["ci95"] == pytest.approx([interval.low, interval.high])
    pooled = analysis["pooled_batch_64"]["weince - infonce"]
    assert pooled["n"] == 10 and pooled["mean"] == pytest.approx((5 * 0.1 + 5 * -0.3) / 10)
    assert pooled["seeds"] == list(range(1, 11))

    text = negatives_study.format_markdown(analysis)
    assert "| `weince` − `infonce` | +0.10 [+0.10, +0.10], 5/0/0 |" in text
    assert "- `weince` − `infonce`: 64: beats; 1024: beats; trend: grows." in text
    assert "`weince` − `infonce`: -0.10" in text and "over 10 seeds; no difference" in text
    negatives_study.plot(analysis, tmp_path / "negatives.png")
    assert (tmp_path / "negatives.png").read_bytes()[:4] == b"\x89PNG"


def test_negatives_budget_rule_is_the_protocols():
    import negatives_budget_search as pilot

    assert [pilot.eval_steps(b) for b in (64, 256, 1024)] == [62, 16, 4]  # the same sentences seen between evals
    assert pilot.scaled_learning_rate(1024, "sqrt") == pytest.approx(1.2e-4)
    assert pilot.scaled_learning_rate(256, "linear") == pytest.approx(1.2e-4)
    assert all(pilot.scaled_learning_rate(64, rule) == 3e-5 for _, rule in pilot.RULES)
    config = pilot.cell_config(1024, 2, 1.2e-4, "no")
    assert (config.batch_size, config.mini_batch_size, config.num_epochs, config.pooler) == (1024, 64, 2, "cls")
    assert pilot.cell_config(64, 1, 3e-5, "no").mini_batch_size is None


def test_hardness_mechanism_gradients_are_the_trainers_and_mass_adds_up(monkeypatch):
    # Study 3's mechanism reads each loss's gradient on the similarity matrix: it must be the trainer's loss, and
    # InfoNCE's softmax puts exactly half of an anchor's mass on its positive (Σ_j≠i p_ij = 1 - p_ii, one slope 1/τ)
    import hardness_mechanism as mechanism
    import torch

    generator = torch.Generator().manual_seed(0)
    anchors = torch.randn(16, 8, generator=generator)
    positives = anchors + 0.3 * torch.randn(16, 8, generator=generator)
    results = {}
    for variant, (loss, alpha) in mechanism.variant_losses((9.0, 9.0)).items():
        grad, sims, weight = mechanism.similarity_gradients(
            anchors, positives, loss=loss, temperature=0.05, hardness_strength=alpha
        )
        summary = mechanism.mass_summary(grad, sims)
        assert torch.allclose(summary["by_rank"].sum(dim=1), torch.ones(16, dtype=torch.float64))
        assert bool((summary["top1"] <= summary["top5"]).all() and (summary["top5"] <= summary["top20"]).all())
        assert bool((summary["effective_negatives"] >= 1).all() and (summary["effective_negatives"] <= 15).all())
        results[variant] = summary
    for variant in ("infonce", "infonce-hardness"):
        assert torch.allclose(results[variant]["positive_share"], torch.full((16,), 0.5, dtype=torch.float64))
    assert not torch.allclose(results["weince"]["positive_share"], results["infonce"]["positive_share"])
    # the hardness term concentrates the negatives' mass on the hardest
    assert float(results["infonce-hardness"]["top1"].mean()) > float(results["infonce"]["top1"].mean())
    original = mechanism.weince_logits
    monkeypatch.setattr(mechanism, "weince_logits", lambda sims, *rest: original(sims, *rest) * 1.01)
    with pytest.raises(RuntimeError, match="the trainer's"):  # a loss written wrongly on S is caught
        mechanism.similarity_gradients(anchors, positives, loss="weince", temperature=0.05, hardness_strength=0)


def test_hardness_study_analysis_table_and_figure(tmp_path):
    """Study 3's analysis on made-up runs with known differences: ours beats the peer by +0.3 on three settings and
    by nothing on the fourth, so the pooled rule holds; the table and the cross-setting figure are written."""
    import hardness_study

    def runs(ours_over_peer):
        def score(variant, seed):
            base = 80.0 + 0.1 * seed
            return base + {"infonce": 0.0, "weince": 0.1, "infonce-hardness": 0.4}.get(variant, 0.4 + ours_over_peer)

        return [{"variant": v, "seed": s, "stsb_test": score(v, s) + (0.01 * s if v == "weince-hardness" else 0)}
                for v in hardness_study.STUDY_VARIANTS for s in (21, 22, 23, 24, 25)]  # fmt: skip

    by_setting = {name: runs(0.3 if name != "sick-pairs" else -0.23) for name in hardness_study.SETTINGS}
    analysis = {**hardness_study.analyse(by_setting), "alpha": {"infonce-hardness": 9, "weince-hardness": 18}}
    primary = analysis["per_setting"]["cpu-cls"]["weince-hardness - infonce-hardness"]
    assert primary["mean"] == pytest.approx(0.3 + 0.23) and primary["wins"] == 5 and primary["decision"] == "beats"
    assert analysis["per_setting"]["sick-pairs"]["weince-hardness - infonce-hardness"]["mean"] == pytest.approx(0.0)
    assert analysis["pooled"] == {"wins": 3, "losses": 0, "settings": 4, "holds": True}
    text = hardness_study.format_markdown(analysis)
    assert "| `weince-hardness` − `infonce-hardness` | +0.53 [" in text and "**holds**" in text
    assert "- `weince` − `infonce`: cpu-cls: beats; stsb-sentences: beats" in text
    hardness_study.plot(analysis, tmp_path / "hardness.png")
    assert (tmp_path / "hardness.png").read_bytes()[:4] == b"\x89PNG"
    # three settings only: the pooled rule cannot hold, whatever they show
    partial = hardness_study.analyse({name: by_setting[name] for name in hardness_study.SETTINGS[:3]})
    assert partial["pooled"]["holds"] is False


def test_archived_study3_cells_are_read_by_the_study_script(data_dir, tmp_path):
    """The archived cells of Study 3's setting A (trained at its pinned commit) are *finished* cells for this
    checkout's ``hardness_study`` configs: summarising the grid from main must read them, not refuse them as trained
    with other settings (as happened when ``eval_bf16``'s default became ``auto``) nor train them again."""
    import hardness_study

    from simcse_weince.compare.cells import cell_configs, check_cell
    from simcse_weince.text import TEXT_CELLS

    archive = REPO_ROOT / "results" / "study" / "hardness" / "cells" / "cpu-cls"
    seeds = sorted(int(cell.parent.name.split("-")[1]) for cell in archive.glob("infonce/seed-*/results.json"))
    if not seeds:
        pytest.skip("no archived Study 3 cell of setting A")
    choice = json.loads((REPO_ROOT / "results/study/hardness-pilot/pilot.json").read_text(encoding="utf-8"))["choice"]
    base = hardness_study.setting_configs(data_dir, tmp_path)["cpu-cls"]  # (writes B and C's data files there)
    configs = cell_configs(base, hardness_study.study_variants(choice), seeds[:2], archive)
    for (variant, seed), config in configs.items():
        state = check_cell(config, TEXT_CELLS)
        assert state.results is not None, f"{variant} seed {seed} was not read as finished"
        assert state.results["config"]["loss"] == config.loss


def test_hardness_mechanism_batches_are_sentences_or_pairs(tmp_path):
    # setting A's sentences give one-column rows (two dropout views each), setting C's pairs (anchor, positive) rows
    import hardness_mechanism as mechanism

    sentences = tmp_path / "sentences.txt"
    sentences.write_text("".join(f"sentence {i}\n" for i in range(10)), encoding="utf-8")
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("sent0,sent1\n" + "".join(f"anchor {i},positive {i}\n" for i in range(10)), encoding="utf-8")
    one = mechanism.fixed_batches(sentences, batches=2, batch_size=4, seed=20)
    two = mechanism.fixed_batches(pairs, batches=2, batch_size=4, seed=20)
    assert [len(batch) for batch in one] == [4, 4] and all(len(row) == 1 for batch in one for row in batch)
    assert len({row for batch in one for row in batch}) == 8  # drawn without replacement
    assert all(row[0].replace("anchor", "positive") == row[1] for batch in two for row in batch)
    # the same seed draws the same rows of either file
    assert [row[0].split()[1] for row in one[0]] == [row[0].split()[1] for row in two[0]]
    triplets = tmp_path / "triplets.csv"
    triplets.write_text("sent0,sent1,hard_neg\na,b,c\n", encoding="utf-8")
    with pytest.raises(ValueError, match="3 columns"):
        mechanism.fixed_batches(triplets, batches=1, batch_size=1, seed=20)


def test_hardness_mechanism_summary_reads_every_archived_measurement(tmp_path):
    import shutil

    import hardness_mechanism_summary as summary

    archived = REPO_ROOT / "results" / "study" / "hardness" / "mechanism"
    shutil.copytree(archived, tmp_path / "mechanism", ignore=shutil.ignore_patterns("summary.*", "*.png"))
    peer = summary.peer_by_alpha(tmp_path / "mechanism")
    assert list(peer) == [9.0, 18.0, 36.0, 72.0]  # the protocol's α, then the peer-alpha-* folders, in order
    protocol = json.loads((archived / "mechanism.json").read_text())
    assert peer[9.0] == protocol["untrained"]["infonce-hardness"]
    # the concentration grows with α, and the positive's share is structural for InfoNCE at every α
    tops = [entry["all"]["top1"] for entry in peer.values()]
    assert tops == sorted(tops) and all(abs(e["all"]["positive_share"] - 0.5) < 1e-9 for e in peer.values())
    text = summary.summary_markdown(tmp_path / "mechanism")
    # the protocol's table, every α, settings C and D
    assert text.count("| `infonce-hardness` | untrained |") == 1 + 4 + 2
    subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "study" / "hardness_mechanism_summary.py"),
                    str(tmp_path / "mechanism"), "--pilot",
                    str(REPO_ROOT / "results" / "study" / "hardness-pilot" / "pilot.json")],
                   check=True, capture_output=True)  # fmt: skip
    assert (tmp_path / "mechanism" / "summary.png").stat().st_size > 10_000
    assert (tmp_path / "mechanism" / "summary.md").read_text() == text


def test_archived_study3_summary_is_what_its_archived_cells_give():
    """Study 3's published answer (``hardness.json`` / ``hardness.md``, quoted in docs/studies/ and the README)
    must be what the protocol's analysis computes from the 80 archived cells, and every cell must count under the
    protocol's rules: trained at the pinned commit, on the pinned releases, in fp32, with its variant's loss and α."""
    import hardness_study

    from simcse_weince.compare.cells import cell_dir
    from simcse_weince.text.cells import run_metrics

    study = REPO_ROOT / "results" / "study" / "hardness"
    archived = json.loads((study / "hardness.json").read_text(encoding="utf-8"))
    pinned = (study / "constraints.txt").read_text(encoding="utf-8").splitlines()
    pins = dict(line.strip().split("==") for line in pinned if "==" in line)
    variants = hardness_study.study_variants(archived["alpha"])
    seeds = (21, 22, 23, 24, 25)
    runs_by_setting = {}
    for setting in hardness_study.SETTINGS:
        runs = []
        for variant, spec in variants.items():
            for seed in seeds:
                cell = cell_dir(study / "cells" / setting, variant, seed)
                where = str(cell.relative_to(study))
                results = json.loads((cell / "results.json").read_text(encoding="utf-8"))
                versions = results["versions"]
                assert versions["git_commit"].startswith("81387e1"), where  # the protocol's pinned worktree
                for package, recorded in (("torch", versions["torch"].split("+")[0]),
                                          ("transformers", versions["transformers"]),
                                          ("sentence-transformers", versions["sentence_transformers"])):  # fmt: skip
                    assert recorded == pins[package], f"{where}: {package} {recorded}, pinned {pins[package]}"
                assert results["mixed_precision"] == "no", where
                config = results["config"]
                assert (config["loss"], config["seed"]) == (spec["loss"], seed), where
                assert config["hardness_strength"] == spec.get("hardness_strength", 0.0), where
                runs.append({"variant": variant, "seed": seed, **run_metrics(results)})
        runs_by_setting[setting] = runs
    recomputed = {**hardness_study.analyse(runs_by_setting), "alpha": archived["alpha"]}
    assert recomputed["pooled"] == archived["pooled"]
    for setting, contrasts in archived["per_setting"].items():
        for key, result in contrasts.items():
            again = recomputed["per_setting"][setting][key]
            assert again["mean"] == pytest.approx(result["mean"]), (setting, key)
            assert again["ci95"] == pytest.approx(result["ci95"]), (setting, key)
            assert (again["wins"], again["ties"], again["losses"], again["decision"]) == (
                result["wins"], result["ties"], result["losses"], result["decision"]), (setting, key)  # fmt: skip
    assert hardness_study.format_markdown(recomputed) == (study / "hardness.md").read_text(encoding="utf-8")
