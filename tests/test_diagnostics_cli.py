"""Diagnostics on real encoders and data: collection (text and images), figures, and ``simcse-weince diagnose``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from simcse_weince import cli
from simcse_weince.diagnostics import (
    candidate_sets,
    distinct_rows,
    encode_images,
    encode_sentences,
    fit_gpd,
    fit_link,
    k_sweep,
    negative_similarities,
    plots,
    read_sentence_pairs,
    read_sentences,
)

FIGURES = ["pot_exceedances.png", "pot_qq.png", "pot_threshold_stability.png", "link_profile.png", "k_sweep.png"]


# ------------------------------------------------------------------------------------------ collection


def test_read_sentences_and_pairs_from_the_shared_data(data_dir, tmp_path):
    sentences = read_sentences(data_dir / "wiki1m_head.txt", max_sentences=500)
    assert len(sentences) == 500 == len(set(sentences)) and all(s == s.strip() and s for s in sentences)
    pairs, scores = read_sentence_pairs(data_dir / "stsbenchmark" / "sts-train.csv", min_score=4.0)
    assert len(pairs) > 1000 and min(scores) >= 4.0
    assert all(a != b for a, b in pairs)
    (tmp_path / "two.tsv").write_text("a cat\ta kitten\nx\ty\n", encoding="utf-8")
    assert read_sentence_pairs(tmp_path / "two.tsv")[0] == [("a cat", "a kitten"), ("x", "y")]
    with pytest.raises(FileNotFoundError):
        read_sentences(tmp_path / "missing.txt")
    (tmp_path / "one.txt").write_text("same\nsame\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="distinct"):
        read_sentences(tmp_path / "one.txt")


def test_raw_hf_encoder_views_and_sentence_transformer_agree(tiny_model):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    sentences = ["a man plays a guitar.", "the cat sleeps", "stocks fell sharply on monday in new york"]
    model = AutoModel.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    plain = encode_sentences(model, sentences, tokenizer=tokenizer, show_progress_bar=False)
    again = encode_sentences(model, sentences, tokenizer=tokenizer, show_progress_bar=False)
    dropout = encode_sentences(model, sentences, tokenizer=tokenizer, dropout=True, show_progress_bar=False)
    assert plain.shape == (3, 32) and plain.dtype == torch.float32
    assert torch.allclose(plain.norm(dim=1), torch.ones(3), atol=1e-5)
    assert torch.equal(plain, again) and not torch.allclose(plain, dropout)  # a second, dropout view
    assert not model.training  # the mode is restored
    wrapped = SentenceTransformer(tiny_model, device="cpu")
    via_st = encode_sentences(wrapped, sentences, show_progress_bar=False)
    assert torch.allclose(via_st, plain, atol=1e-5)  # same mean pooling
    with pytest.raises(ValueError, match="tokenizer"):
        encode_sentences(model, sentences)


def test_image_collection_with_any_module_over_a_torchvision_dataset():
    from torchvision import datasets, transforms

    dataset = datasets.FakeData(
        size=40, image_size=(3, 16, 16), num_classes=4, transform=transforms.ToTensor(), random_offset=0
    )
    encoder = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(2))
    embeddings = encode_images(encoder, dataset, batch_size=16, max_items=30, show_progress_bar=False)
    assert embeddings.shape == (30, 32)
    scores = negative_similarities(embeddings[distinct_rows(embeddings)], show_progress_bar=False)
    assert scores.size == 30 * 29 // 2 and np.all(scores <= 1 + 1e-6)


def test_negative_similarities_are_distinct_pairs_with_a_memory_cap():
    generator = torch.Generator().manual_seed(0)
    embeddings = torch.randn(300, 16, generator=generator)
    embeddings = torch.cat([embeddings, embeddings[:5]])  # exact duplicates are not negatives
    keep = distinct_rows(embeddings)
    assert keep.tolist() == list(range(300))
    scores = negative_similarities(embeddings[keep], chunk_size=64, show_progress_bar=False)
    normalized = torch.nn.functional.normalize(embeddings[:300], dim=1)
    expected = (normalized @ normalized.T)[torch.triu_indices(300, 300, 1).unbind()].double().numpy()
    assert scores.size == 300 * 299 // 2
    assert np.allclose(np.sort(scores), np.sort(expected), atol=1e-6)
    capped = negative_similarities(embeddings[keep], max_scores=5_000, show_progress_bar=False)
    assert 4_000 < capped.size <= 5_000
    assert np.quantile(capped, 0.9) == pytest.approx(np.quantile(scores, 0.9), abs=0.02)  # uniform subsample


def test_candidate_sets_put_the_positive_first():
    generator = torch.Generator().manual_seed(1)
    anchors = torch.randn(20, 8, generator=generator)
    positives = anchors + 0.1 * torch.randn(20, 8, generator=generator)
    pool = torch.randn(50, 8, generator=generator)
    sets = candidate_sets(anchors, positives, pool, num_candidates=10)
    assert sets.shape == (20, 10)
    expected = torch.nn.functional.cosine_similarity(anchors, positives).double().numpy()
    assert np.allclose(sets[:, 0], expected, atol=1e-6)
    with pytest.raises(ValueError, match="pool holds"):
        candidate_sets(anchors, positives, pool, num_candidates=60)


# --------------------------------------------------------------------------------------------- figures


def test_figures_are_written(tmp_path):
    from scipy import stats

    rng = np.random.default_rng(0)
    fit = fit_gpd(0.5 + stats.genpareto.rvs(-0.4, scale=0.1, size=20_000, random_state=0))
    plots.plot_exceedances(fit, tmp_path / "exceedances.png")
    plots.plot_qq(fit, tmp_path / "qq.png")
    plots.plot_threshold_stability([{"quantile": 0.99, "xi": fit.xi, "xi_se": fit.xi_se}], tmp_path / "ts.png")
    scores = rng.uniform(-0.2, 0.9, size=(300, 16))
    winners = (8 * scores + rng.gumbel(size=scores.shape)).argmax(axis=1)
    plots.plot_link_profile(fit_link(scores, winners), tmp_path / "link.png")
    sweep = k_sweep(np.full(40, 0.6), rng.uniform(-0.2, 0.5, size=(40, 256)), temperature=0.2, n_draws=2)
    plots.plot_k_sweep(sweep, tmp_path / "k.png", batch_size=64)
    for name in ("exceedances", "qq", "ts", "link", "k"):
        data = (tmp_path / f"{name}.png").read_bytes()
        assert data[:4] == b"\x89PNG" and 5_000 < len(data) < 200_000


def test_lambda_statistics_over_training_from_dicts_and_csv(tmp_path):
    rows = [
        {
            "step": step,
            "lambda_mean": 0.3 + step / 1000,
            "lambda_above_half": 0.2,
            "rho0": 0.4,
            "delta_aic_mean": 5.0,
            "beta_hat_mean": 3.0,
        }
        for step in range(0, 200, 10)
    ]
    plots.plot_lambda_statistics(rows, tmp_path / "from_dicts.png")
    # The trainers' one log format: <run>/logs/metrics.csv, long (step,name,value); a step without statistics
    # (an evaluation row) is skipped for them.
    long_csv = tmp_path / "run" / "logs" / "metrics.csv"
    long_csv.parent.mkdir(parents=True)
    long_rows = [f"{r['step']},{name},{r[name]}" for r in rows for name in ("loss", "lambda_mean", "rho0") if name in r]
    long_csv.write_text("step,name,value\n" + "\n".join(long_rows) + "\n200,stsb_dev_spearman,80.1\n", encoding="utf-8")
    loaded = plots.load_training_log(long_csv)
    assert len(loaded) == 21 and float(loaded[3]["lambda_mean"]) == pytest.approx(rows[3]["lambda_mean"])
    assert plots.load_training_log(tmp_path / "run") == loaded  # a run folder stands for its log
    figure = plots.plot_lambda_statistics(long_csv, tmp_path / "from_csv.png")
    assert len([a for a in figure.axes if a.get_visible()]) == 2  # only the statistics present
    assert (tmp_path / "from_csv.png").stat().st_size > 5_000
    (tmp_path / "wide.csv").write_text("step,lambda_mean\n1,0.3\n", encoding="utf-8")
    with pytest.raises(ValueError, match="step,name,value"):
        plots.load_training_log(tmp_path / "wide.csv")
    with pytest.raises(ValueError, match="none of the columns"):
        plots.plot_lambda_statistics([{"step": 1, "loss": 2.0}])
    with pytest.raises(FileNotFoundError):
        plots.plot_lambda_statistics(tmp_path / "missing.csv")


def test_lambda_statistics_plot_the_diagnostic_keys_of_the_losses():
    """The plot's default panels are the statistics the losses report, named once in weince.STATISTIC_KEYS."""
    from simcse_weince.weince.loss import STATISTIC_KEYS

    assert set(plots._LABELS) == set(STATISTIC_KEYS)  # every statistic has an axis label, and no other
    rows = [{"step": step, **dict.fromkeys(STATISTIC_KEYS, 0.1 * step)} for step in range(3)]
    figure = plots.plot_lambda_statistics(rows)
    assert [axis.get_title() for axis in figure.axes if axis.get_visible()] == list(STATISTIC_KEYS)


# ------------------------------------------------------------------------------------------------- CLI


def test_diagnose_minilm_on_real_sentences_and_sts_pairs(minilm_path, wiki_sentences, data_dir, tmp_path):
    data = tmp_path / "sentences.txt"
    data.write_text("\n".join(wiki_sentences[:300]) + "\n", encoding="utf-8")
    output = tmp_path / "report"
    status = cli.main(
        [
            "diagnose",
            minilm_path,
            "--data",
            str(data),
            "--pairs",
            str(data_dir / "stsbenchmark" / "sts-dev.csv"),
            "--output-dir",
            str(output),
            "--max-pairs",
            "120",
            "--pool-size",
            "150",
            "--batch-size",
            "64",
            "--no-progress",
        ]
    )
    assert status == 0
    report = json.loads((output / "report.json").read_text())
    pot = report["pot"]
    assert report["sentences"] <= 300 and pot["n_exceedances"] >= 30
    assert -1.0 < pot["xi"] < 1.0 and pot["xi_se"] > 0 and pot["threshold"] < pot["max_score"] <= 1.0 + 1e-6
    assert len(pot["threshold_stability"]) == 7
    assert 0.0 <= pot["per_anchor_tail_statistics"]["share_weibull_favoured"] <= 1.0
    assert report["positives"]["anchors"] == 120 and report["positives"]["pool"] == 150
    link = report["link"]
    # the link fit must succeed on these 120 real anchors (it does: MiniLM's winners fit the softmax link, lambda 0)
    assert "error" not in link, link.get("error")
    assert 0.0 <= link["mixing_ci"][0] <= link["mixing"] <= link["mixing_ci"][1] <= 1.0
    assert link["n_observations"] == 120 and link["n_candidates"] == 64
    # nested fits: the free-lambda likelihood is never below the softmax one, and the LR statistic is twice the gap
    assert link["loglik"] >= link["softmax_loglik"] - 1e-9
    assert link["lr_statistic"] == pytest.approx(2 * (link["loglik"] - link["softmax_loglik"]), abs=1e-6)
    sweep = report["k_sweep"]
    assert sweep["ks"][-1] == 128 and sweep["temperature"] == 0.05 and sweep["ce_inf_direct"] is not None
    for name in report["figures"]:
        assert (output / name).stat().st_size > 5_000
    assert set(report["figures"]) >= set(FIGURES)


def test_diagnose_without_pairs_uses_dropout_views(tiny_model, wiki_sentences, tmp_path):
    """The Python entry point (the CLI only parses into it): diagnose() returns what report.json holds."""
    from simcse_weince.diagnostics import diagnose

    data = tmp_path / "sentences.txt"
    data.write_text("\n".join(wiki_sentences[:200]) + "\n", encoding="utf-8")
    output = tmp_path / "out"
    log = tmp_path / "metrics.csv"
    log.write_text("step,name,value\n1,lambda_mean,0.3\n1,loss,2.0\n2,lambda_mean,0.35\n", encoding="utf-8")
    with pytest.raises(ValueError, match="--temperature must be > 0"):
        diagnose(tiny_model, data, temperature=0.0, output_dir=str(output))
    returned = diagnose(
        tiny_model, data, k_sweep=True, link=True, output_dir=str(output), max_pairs=60, batch_size=32,
        temperature=0.5, training_log=str(log), no_progress=True,
    )  # fmt: skip
    report = json.loads((output / "report.json").read_text())
    assert returned["figures"] == report["figures"] and returned["positives"] == report["positives"]
    assert report["settings"]["temperature"] == 0.5 and report["settings"]["link"] is True
    assert "pot" not in report and "dropout" in report["positives"]["source"]
    assert report["positives"]["anchors"] == 60 and report["positives"]["pool"] == 140
    assert "k_sweep" in report and "link" in report
    assert "lambda_statistics.png" in report["figures"] and (output / "lambda_statistics.png").is_file()


def test_diagnose_reports_user_errors_in_one_line(minilm_path, tmp_path, capsys):
    assert cli.main(["diagnose", minilm_path, "--data", str(tmp_path / "nope.txt")]) == 1
    assert "--data file not found" in capsys.readouterr().err
    data = tmp_path / "s.txt"
    data.write_text("a\nb\nc\n", encoding="utf-8")
    assert cli.main(["diagnose", minilm_path, "--data", str(data), "--temperature", "0"]) == 1
    assert "--temperature must be > 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("log_text", "expect"),
    [
        ("step,name,value\n1,loss,2.0\n2,loss,1.9\n", "has none of the columns lambda_mean"),
        ("epoch,loss\n1,2.0\n", "is not a training log: expected the columns step,name,value"),
        (None, "--training-log file not found"),
    ],
    ids=["no-lambda-columns", "not-a-log", "missing"],
)
def test_diagnose_checks_the_training_log_before_it_writes(tiny_model, wiki_sentences, tmp_path, capsys,
                                                           log_text, expect):  # fmt: skip
    """Issue 54 case 8: a bad --training-log was read after the analysis had replaced the figures, leaving the old
    report.json beside new figures. Now it is refused in one line naming the file and the folder is untouched."""
    from train_helpers import tree_digest

    data = tmp_path / "sentences.txt"
    data.write_text("\n".join(wiki_sentences[:60]) + "\n", encoding="utf-8")
    output = tmp_path / "out"
    output.mkdir()
    (output / "report.json").write_text('{"figures": ["pot_qq.png"]}')
    (output / "pot_qq.png").write_bytes(b"an earlier figure")
    before = tree_digest(output)
    log = tmp_path / "metrics.csv"
    if log_text is not None:
        log.write_text(log_text, encoding="utf-8")
    argv = ["diagnose", tiny_model, "--data", str(data), "--pot", "--output-dir", str(output),
            "--training-log", str(log), "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and expect in lines[0] and str(log) in lines[0], err[-2000:]
    assert tree_digest(output) == before


def test_diagnose_replaces_its_outputs_together_or_not_at_all(tiny_model, wiki_sentences, tmp_path,
                                                              monkeypatch):  # fmt: skip
    """A failure after the first figures were drawn (here: in the last one) leaves the earlier report and
    figures as they were and no staged file behind; a run that completes replaces them all."""
    from train_helpers import tree_digest

    from simcse_weince.diagnostics import diagnose
    from simcse_weince.diagnostics.pipeline import STAGING_PREFIX

    data = tmp_path / "sentences.txt"
    data.write_text("\n".join(wiki_sentences[:80]) + "\n", encoding="utf-8")
    log = tmp_path / "metrics.csv"
    log.write_text("step,name,value\n1,lambda_mean,0.3\n2,lambda_mean,0.35\n", encoding="utf-8")
    output = tmp_path / "out"
    output.mkdir()
    (output / "report.json").write_text('{"figures": ["k_sweep.png"]}')
    (output / "k_sweep.png").write_bytes(b"an earlier figure")
    before = tree_digest(output)

    def failing_plot(*args, **kwargs):
        raise RuntimeError("the last figure failed")

    monkeypatch.setattr(plots, "plot_lambda_statistics", failing_plot)
    settings = dict(k_sweep=True, max_pairs=20, batch_size=16, output_dir=str(output), training_log=str(log),
                    no_progress=True)  # fmt: skip
    with pytest.raises(RuntimeError, match="the last figure failed"):
        diagnose(tiny_model, data, **settings)
    assert tree_digest(output) == before and not list(output.glob(f"{STAGING_PREFIX}*"))
    monkeypatch.undo()
    report = diagnose(tiny_model, data, **settings)
    assert json.loads((output / "report.json").read_text()) == report
    assert (output / "k_sweep.png").read_bytes() != b"an earlier figure"
    assert not list(output.glob(f"{STAGING_PREFIX}*"))
