"""Plant known bugs in a temporary copy of the package, one at a time, and check the default tests kill each one.

    python scripts/tools/mutation_check.py                 # every mutation
    python scripts/tools/mutation_check.py --only gate     # the mutations whose name contains "gate"
    python scripts/tools/mutation_check.py --list          # names, files and test selections

The working tree is copied to a temporary folder (with ``../shared`` linked beside it, so the tests find the real
data); each mutation replaces one short snippet of a source file (the snippet must occur exactly once, otherwise the
mutation is reported as NOT APPLIED and the script fails), runs the focused default tests that should catch it with
``PYTHONPATH`` pointing at the copy and ``CI=true`` (missing data fails rather than skips), and restores the file.
A mutation is *killed* when those tests fail. The script exits 0 only when every mutation applied and was killed.
Run it before resolving any issue that changes behaviour; if a planted bug survives, add the missing test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LAST_FAILURE = ""  # the tail of the last failing test run's output


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the repository root
    # (original snippet, replacement) in path, or (another path, snippet, replacement); each original must occur
    # exactly once in its file
    edits: tuple[tuple[str, ...], ...]
    tests: tuple[str, ...]  # pytest arguments: files, node ids, "-k" expressions
    why: str


# one mutation per compact block: the formatter would spread each over a dozen lines
# fmt: off
CORE, TRAIN, LOOP = "simcse_weince/weince/loss.py", "simcse_weince/text/trainer.py", "simcse_weince/training/loop.py"
ENCODERS = "simcse_weince/evaluation/encoders.py"
TAIL, SPEEDUPS = "simcse_weince/weince/tail.py", "simcse_weince/weince/speedups.py"
COLUMNS = "simcse_weince/losses/_columns.py"
RESULTS = "simcse_weince/text/results.py"
OBJECTIVE = "simcse_weince/losses/from_embeddings.py"  # the trainers' ContrastiveObjective
VISION_TRAIN, AUGMENT = "simcse_weince/vision/trainer.py", "simcse_weince/vision/augment.py"
TRUST = "tests/test_checkpoint_trust.py"
RUN_FOLDERS, DIAGNOSE = "tests/test_run_folders.py", "simcse_weince/diagnostics/pipeline.py"
RUN_FOLDER, CHECKPOINT_FILES = "simcse_weince/training/run_folder.py", "simcse_weince/training/checkpoints.py"
WALKS = "tests/test_run_folder_faults.py"
FUNCTION_LENGTH = "tests/test_function_length.py"
CASES, FOLDER_IO = "tests/test_run_folder_cases.py", "simcse_weince/training/folder_io.py"
SIGNALS, CELLS = "simcse_weince/training/signals.py", "simcse_weince/compare/cells.py"
FAST_PATH, COMPAT = "simcse_weince/text/fast_path/__init__.py", "simcse_weince/compat.py"
FROM_EMBEDDINGS, GRADCACHE = "simcse_weince/losses/from_embeddings.py", "simcse_weince/text/gradcache.py"
STATISTICS_CALLBACK = "simcse_weince/losses/weince_statistics_callback.py"
HAND = ("tests/test_weince_core.py", "-k", "by_hand")
DOCS_WORDS = "tests/test_docs_speak_of_the_project.py"
CORRECTIONS_RECORD = "docs/studies/2026-12-07-corrections-and-multiplicity.md"
DIRECTIONS, MNRL_TESTS = "simcse_weince/weince/directions.py", "tests/test_mnrl_equivalence.py"
BRUTE = ("tests/test_weince_bruteforce.py",)
API_TESTS, CACHED_BASE = "tests/test_mnrl_api.py", "simcse_weince/losses/_cached.py"

MUTATIONS = (
    # ---- the functional core
    Mutation(
        "core: gate='rho' and gate='aic' swapped", TAIL,
        (('gate == "rho":\n        return lambda_rho', 'gate == "aic":\n        return lambda_rho'),
         ('gate == "aic":\n        return lambda_aic', 'gate == "rho":\n        return lambda_aic')),
        HAND, "issue 13: test_gates only checked both == rho * aic",
    ),
    Mutation(
        "core: simcse positive counted among the negatives of the tail", CORE,
        (("for offset in layout.not_negative_diagonals:", "for offset in layout.not_negative_diagonals[1:]:"),),
        BRUTE, "issue 13: every core, reference and loss test passed with it",
    ),
    Mutation(
        "core: burn-in of 0 points", TAIL,
        (("return max(1, tail_size // 20)", "return max(0, tail_size // 20)"),),
        BRUTE, "docs/method.md#step-3-plotting-positions-and-the-skipped-top-points",
    ),
    Mutation(
        "core: plotting positions r / k instead of r / (k + 1)", TAIL,
        (("targets = _link_targets(ranks / (k + 1))", "targets = _link_targets(ranks / k)"),),
        BRUTE, "docs/method.md#step-3-plotting-positions-and-the-skipped-top-points",
    ),
    Mutation(
        "core: rho_0 index truncated instead of rounded", TAIL,
        (("round(weince.quantile * (rho.numel() - 1))", "int(weince.quantile * (rho.numel() - 1))"),),
        HAND, "docs/method.md#the-batch-reference",
    ),
    Mutation(
        "core: estimated beta not clamped above", TAIL,
        (("stats.beta_hat.clamp(weince.beta_min, weince.beta_max)", "stats.beta_hat.clamp(weince.beta_min)"),),
        BRUTE, "docs/method.md#the-shortfall-exponent: beta-hat clamped to [0.5, 16]",
    ),
    Mutation(
        "core: share of lambda > 0.5 counts lambda = 0.5", CORE,
        (("        (weight > 0.5).float().mean(),", "        (weight >= 0.5).float().mean(),"),),
        HAND, "summarize_statistics values were never checked",
    ),
    Mutation(
        "core: mean beta reported instead of mean beta-hat", CORE,
        (('        stats["beta_hat"].mean(),\n', '        stats["beta"].mean(),\n'),),
        HAND, "summarize_statistics values were never checked",
    ),
    Mutation(
        "core: the closed-form backward keeps the shortfall term's gradient at the eps floor", SPEEDUPS,
        (("F.threshold_(shortfall, eps, math.inf)", "shortfall.clamp_min_(eps)"),),
        (*BRUTE, "-k", "endpoint"), "issue 55: weince/reference.py clamps s at 1 - eps, as the paper writes it",
    ),
    Mutation(
        "core: simclr's hardness weighting also weighs the positive", CORE,
        (("mask = ~layout.not_negative", "mask = ~layout.self_mask"),),
        (*BRUTE, "-k", "each_option"), "issue 55: the reference covers the hardness options in both geometries",
    ),
    # ---- the sentence-transformers losses
    Mutation(
        "losses: one column, both views from a single dropout sample", COLUMNS,
        (("return compat.embed_columns(model, sentence_features, separate_first=False)",
          "return [compat.embed_columns(model, sentence_features[:1], separate_first=False)[0]] * 2"),),
        ("tests/test_losses.py", "-k", "fixed_batch"), "issue 13: test_losses.py:84-97 never compared the views",
    ),
    Mutation(
        "losses: extra hard-negative columns dropped", FROM_EMBEDDINGS,
        (("candidates = torch.cat(candidate_columns, dim=0)", "candidates = candidate_columns[0]"),),
        ("tests/test_losses.py", "-k", "mnrl"), "triplets must add negatives",
    ),
    Mutation(
        "losses: InfoNCELoss ignores its temperature", COLUMNS,
        (("loss=self.loss_name, temperature=resolve_temperature(temperature, scale),",
          "loss=self.loss_name, temperature=1.0 if self.loss_name == 'infonce' else "
          "resolve_temperature(temperature, scale),"),),
        ("tests/test_losses.py", "-k", "mnrl"), "InfoNCELoss = MNRL(scale = 1 / temperature)",
    ),
    # ---- the text trainer
    Mutation(
        "text trainer: no optimizer.step() and model.eval() instead of model.train()", TRAIN,
        (("optimizer.step()\n", "pass\n"),
         (LOOP, "                model.train()", "                model.eval()")),
        ("tests/test_train.py", "-k", "fixed_batch"), "issue 13: every trainer test passed with it",
    ),
    Mutation(
        "text trainer: no optimizer.step()", TRAIN, (("optimizer.step()\n", "pass\n"),),
        ("tests/test_train.py", "-k", "fixed_batch"), "weights must change",
    ),
    Mutation(
        "training loop: model.eval() instead of model.train() (text: no dropout views)", LOOP,
        (("                model.train()", "                model.eval()"),),
        ("tests/test_train.py", "-k", "fixed_batch"), "SimCSE's positives come from dropout",
    ),
    Mutation(
        "training loop: the shape-keyed CPU kernel caches left at torch's 1,024 entries", LOOP,
        (("    bound_kernel_caches()  # before any kernel", "    pass  # before any kernel"),),
        ("tests/test_kernel_caches.py",), "every new batch shape grew the process by a kernel until 2 x 1,024",
    ),
    Mutation(
        "text trainer: the last step exported instead of the best dev step", RESULTS,
        (("load_weights(self.model.evaluation_modules(), self.best_dir)", "pass"),),
        ("tests/test_train.py", "-k", "best_dev"), "the best-dev checkpoint is the exported one",
    ),
    Mutation(
        "text trainer: the worst dev step kept as the best", RESULTS,
        (('score > state["best_stsb_dev_spearman"]', 'score < state["best_stsb_dev_spearman"]'),),
        ("tests/test_train.py", "-k", "best_dev"), "model selection on STS-B dev",
    ),
    # ---- MNRL's options (issue 53)
    Mutation(
        "directions: the doc_to_query positive counted among the tail's negatives", DIRECTIONS,
        (("blocks.append(_Block(sims, precise, None, eye))", "blocks.append(_Block(sims, precise, None, None))"),),
        (MNRL_TESTS, "-k", "documented_loss"), "docs/directions.md: a row's positives are not its negatives",
    ),
    Mutation(
        "hardness: hard_negatives weights the in-batch negatives", CORE,
        (("return (columns % num_rows == rows) & (columns >= num_rows)", "return columns % num_rows != rows"),),
        (MNRL_TESTS, "-k", "plain_losses and triplets"), "MNRL's hardness_mode='hard_negatives' (EmbeddingGemma)",
    ),
    Mutation(
        "options: per_direction accepted with query_to_query", FROM_EMBEDDINGS,
        (('if partition_mode == "per_direction" and same_type:', "if False:"),),
        (MNRL_TESTS, "-k", "refused"), "refused as MNRL refuses it",
    ),
    Mutation(
        "options: scale read as a temperature", COLUMNS,
        (("return 1.0 / float(scale)", "return float(scale)"),),
        (MNRL_TESTS, "-k", "plain_losses and pairs"), "scale = 1 / temperature, MNRL's spelling",
    ),
    # ---- MNRL at the API's edges: a batch of one, positional arguments, assignment, config keys, citations
    Mutation(
        "losses: a batch of one anchor refused", FROM_EMBEDDINGS,
        (('if anchors.shape[0] < 2 and settings.geometry == "simcse":', "if False:"),),
        (API_TESTS, "-k", "batch_of_one"), "the last batch of an epoch without drop_last stopped the run",
    ),
    Mutation(
        "losses: MNRL's second positional taken as a temperature", COLUMNS,
        (("temperature=resolve_temperature(temperature, scale),",
          "temperature=resolve_temperature(scale, temperature),"),),
        (API_TESTS, "-k", "positional"), "WeinceLoss(model, 20.0) trained at τ = 20, silently",
    ),
    Mutation(
        "losses: an assigned option not validated", COLUMNS,
        (("        self.settings = dataclasses.replace(self.settings, **changes)",
          "        [object.__setattr__(self.settings, key, value) for key, value in changes.items()]"),),
        (API_TESTS, "-k", "random_sequence"), "a bad value would fail at the next step, or not at all",
    ),
    Mutation(
        "losses: an assigned option not effective", COLUMNS,
        (("        self._replace_settings(**{field: value})", "        self.__dict__[field] = value"),),
        (API_TESTS, "-k", "random_sequence"), "loss.directions = ... would train with the old directions",
    ),
    Mutation(
        "cached losses: an nn.Module similarity filed under the wrapper's _modules", CACHED_BASE,
        (("        if isinstance(getattr(type(self), name, None), property):", "        if False:"),),
        (API_TESTS, "-k", "forward_every_assignment"), "the module would shadow the option, never reaching the loss",
    ),
    Mutation(
        "options: hardness_strength alone applies in-batch weighting", FROM_EMBEDDINGS,
        (("DEFAULT_HARDNESS_MODE = None", 'DEFAULT_HARDNESS_MODE = "in_batch_negatives"'),),
        (MNRL_TESTS, "-k", "hardness_strength_alone"), "MNRL ignores a strength without a mode (2.760 vs 7.410)",
    ),
    Mutation(
        "archived runs: a recorded strength without a mode read as no weighting", "simcse_weince/text/config.py",
        (('if "hardness_mode" not in values and values.get("hardness_strength"):', "if False:"),),
        ("tests/test_train_mnrl_options.py", "-k", "archived"), "the study's hardness cells would read as untrained",
    ),
    Mutation(
        "config dict: temperature reported instead of MNRL's scale", COLUMNS,
        (('            "scale": self.scale,', '            "temperature": self.temperature,'),),
        (API_TESTS, "-k", "config_dict"), "code reading config['scale'] got a KeyError",
    ),
    Mutation(
        "model card: CachedWeinceLoss cites WEINCE twice", "simcse_weince/losses/cached_weince_loss.py",
        (("        return GRADCACHE_CITATION", "        return self.loss.citation + GRADCACHE_CITATION"),),
        (API_TESTS, "-k", "citations"), "the card gathers the wrapper's and the wrapped loss's citations",
    ),
    Mutation(
        "statistics callback: evaluation batches counted as training", STATISTICS_CALLBACK,
        (('slot = (id(loss), "train" if loss.last_batch_training else "eval")', 'slot = (id(loss), "train")'),),
        ("tests/test_statistics_callback.py", "-k", "two_datasets"), "eval λ logged as training λ (0.2071 vs 0.2082)",
    ),
    Mutation(
        "statistics callback: a loss shared by two datasets logged under one", STATISTICS_CALLBACK,
        (("members = [module for module in entry.modules() if isinstance(module, ColumnsLoss)]",
          "members = [module for module in entry.modules() if isinstance(module, ColumnsLoss) "
          "and module not in found.values()]"),),
        ("tests/test_statistics_callback.py", "-k", "shared"), "the second dataset's logs lacked its keys",
    ),
    # ---- the vision trainer and adapter
    Mutation(
        "vision trainer: no optimizer.step()", VISION_TRAIN, (("optimizer.step()\n", "pass\n"),),
        ("tests/test_vision_train.py", "-k", "fixed_batch"), "weights must change",
    ),
    Mutation(
        "vision adapter: both SimCLR views are the same augmentation", AUGMENT,
        (("return self.transform(image), self.transform(image)",
          "view = self.transform(image)\n        return view, view"),),
        ("tests/test_vision_train.py", "-k", "two_views"), "two views of one image must differ",
    ),
    Mutation(
        "trainers' objective: InfoNCE / NT-Xent ignores its temperature", OBJECTIVE,
        (("loss=loss, temperature=float(temperature),",
          "loss=loss, temperature=1.0 if loss == 'infonce' else float(temperature),"),),
        ("tests/test_vision_train.py", "-k", "objective_matches"), "the vision objective is the core loss",
    ),
    # ---- evaluation and diagnostics
    Mutation(
        "evaluation: Pearson reported as Spearman", "simcse_weince/evaluation/scoring.py",
        (("spearman = float(spearmanr(predictions, references)[0])",
          "spearman = float(pearsonr(predictions, references)[0])"),),
        ("tests/test_evaluation.py", "-k", "callable"), "test_evaluation.py:362 accepted any value in (-100, 100)",
    ),
    Mutation(
        "evaluation: STS-B pairs read as (sentence1, sentence1)", "simcse_weince/evaluation/data.py",
        (("sentences2.append(row[6])", "sentences2.append(row[5])"),),
        ("tests/test_evaluation.py", "-k", "callable"), "the raw STS-B file layout",
    ),
    Mutation(
        "diagnostics: link LR statistic without the factor 2", "simcse_weince/diagnostics/link.py",
        (("lr_statistic = max(2.0 * (loglik - softmax_loglik), 0.0)",
          "lr_statistic = max(1.0 * (loglik - softmax_loglik), 0.0)"),),
        ("tests/test_diagnostics.py", "-k", "link_fit_recovers"), "likelihood-ratio test of lambda = 0",
    ),
    Mutation(
        "diagnostics: kNN vote ignores the temperature", "simcse_weince/vision/evaluate.py",
        (("weights = (similarities / temperature).exp()", "weights = similarities.exp()"),),
        ("tests/test_vision_eval.py", "-k", "knn"), "weighted kNN evaluation of frozen features",
    ),
    # ---- GradCache and checkpoint safety
    Mutation(
        "text trainer: GradCache re-encodes without replaying the dropout masks", GRADCACHE,
        (("with synchronize, random_state:", "with synchronize:"),),
        ("tests/test_train_gradcache.py", "-k", "replayed"), "the second pass must see the first pass's masks",
    ),
    Mutation(
        "run folder: resume trusts a checkpoint whose sha256 differs", CHECKPOINT_FILES,
        (('elif file_sha256(path) != entry["sha256"]:', "elif False:"),),
        ("tests/test_bad_inputs.py", "-k", "falls_back and flipped"), "a same-size corruption is only seen by the hash",
    ),
    Mutation(
        "run folder: a failed --overwrite start does not put the earlier run back", RUN_FOLDER,
        (("            folder_io.move(output_dir, aside / name, output_dir / name)\n", "            pass\n"),),
        ("tests/test_bad_inputs.py", "-k", "puts_the_earlier_run_back"), "issue 12: --overwrite lost the earlier run",
    ),
    Mutation(
        "--overwrite: a start killed during its moves is not put back", RUN_FOLDER,
        (("            folder_io.move(output_dir, aside / name, output_dir / name)\n", "            pass\n"),),
        (CASES, "-k", "stopped_overwrite"), "a kill during the move aside or the restore must be settled",
    ),
    # ---- throughput: precision and padding
    Mutation(
        "fast path: length-sorted chunks returned in sorted order", FAST_PATH,
        (("return torch.cat(pooled).index_select(0, torch.argsort(order))", "return torch.cat(pooled)"),),
        ("tests/test_length_chunks.py", "-k", "padded_embeddings"), "each sentence must get its own embedding back",
    ),
    Mutation(
        "precision: auto picks bf16 on any CPU (emulated bf16 is ~25x slower)", "simcse_weince/precision.py",
        (("return compat.cpu_has_avx512_bf16() or amx_tiles()", "return True"),),
        ("tests/test_precision.py", "-k", "cpu_features"), "auto must follow the CPU's native bf16 support",
    ),
    # ---- issue 55: private names of dependencies in one checked place (compat.py)
    Mutation(
        "private names: torch's private AMX probe called again outside compat.py", "simcse_weince/precision.py",
        (("    return compat.cpu_has_amx_tiles()",
          "    import torch\n\n    return bool(torch.cpu._is_amx_tile_supported())"),),
        ("tests/test_private_names.py", "-k", "outside_the_checked"), "issue 55: a private name only behind a check",
    ),
    Mutation(
        "compat: sentence-transformers' merged forward used without its check", COMPAT,
        (("        failure = check_embed_columns(merged)\n", "        failure = None\n"),),
        ("tests/test_private_names.py", "-k", "embed_columns"), "issue 55: a broken release must fall back",
    ),
    Mutation(
        "compat: a torch CPU probe's non-bool answer taken as a feature", COMPAT,
        (("    if isinstance(answer, bool):\n        return answer",
          "    if answer is not None:\n        return True"),),
        ("tests/test_private_names.py", "-k", "cpu_probes"), "issue 55: a probe that cannot answer means no bf16",
    ),
    Mutation(
        "compat: Accelerate's state kept silently when its reset is gone", COMPAT,
        (("    if failure is not None and is_initialized():", "    if False:"),),
        ("tests/test_private_names.py", "-k", "accelerate"), "issue 55: one clear error, not another run's settings",
    ),
    Mutation(
        "length chunks: auto keeps 4 chunks under bf16 on a CPU with AMX", "simcse_weince/text/config.py",
        (("return AUTO_LENGTH_CHUNKS if device_type == \"cpu\" and not amx_tiles() else 1",
          "return AUTO_LENGTH_CHUNKS if device_type == \"cpu\" else 1"),),
        ("tests/test_length_chunks.py", "-k", "auto_follows"), "issue 26: one padded forward pays under AMX bf16",
    ),
    Mutation(
        "unpadded layers: dropout masks drawn for the real tokens only (another random stream)",
        "simcse_weince/text/fast_path/unpadded.py",
        (("torch.empty((*padded_shape, rows.shape[-1]), dtype=rows.dtype, device=rows.device)",
          "torch.empty_like(rows)"),
         ("    return rows * noise.view(-1, rows.shape[-1]).index_select(0, real)", "    return rows * noise")),
        ("tests/test_unpadded.py",), "issue 26: the same masks as the padded forward, so the same step losses",
    ),
    Mutation(
        "unpadded layers: padding tokens enter the linear layers' rows", "simcse_weince/text/fast_path/unpadded.py",
        (("    real = flat.nonzero().squeeze(1)", "    real = torch.arange(flat.numel(), device=flat.device)"),),
        ("tests/test_unpadded.py",), "issue 26: padded rows must come back as zeros and never be computed",
    ),
    Mutation(
        "unpadded layers: the padding rows that round the row count up come back in the result",
        "simcse_weince/text/fast_path/unpadded.py",
        (("    return _pad(hidden[:real_count], real[:real_count], padded_shape)", "    return _pad(hidden, real, padded_shape)"),),  # noqa: E501
        ("tests/test_unpadded.py", "-k", "rounding"), "the result's padding positions stay zero",
    ),
    Mutation(
        "unpadded layers: every length chunk looks up the word embeddings again", FAST_PATH,
        (("        if self.unpadded_layers:\n            # the word embeddings looked up once",
          "        if False:\n            # the word embeddings looked up once"),),
        ("tests/test_unpadded.py", "-k", "once"), "issue 26: the vocabulary-sized gradient built once a step",
    ),
    Mutation(
        "trainer: unpadded_layers never applied", FAST_PATH,
        (("    unpadded = bool(speed.unpadded_layers and not speed.compile and supports_unpadded(encoder))",
          "    unpadded = False"),),
        ("tests/test_train.py", "-k", "end_to_end"), "issue 26: the default trains with unpadded linear layers",
    ),
    Mutation(
        "fast path: the start-up check removed (a broken release trains on the broken forward)", FAST_PATH,
        (("        failure = check_training_forward(encoder, candidate, max_length=",
          "        failure = None and check_training_forward(encoder, candidate, max_length="),),
        ("tests/test_fast_path.py", "-k", "broken_release"), "issue 37: transformers 5.25 broke step 0",
    ),
    Mutation(
        "fast path: a failed check skips the fallback (the forward that failed is kept)", FAST_PATH,
        (("    return replace(candidate, report=report)", "    return replace(asked, report=report)"),),
        ("tests/test_fast_path.py", "-k", "broken_release or also_fails"), "issue 37: the fallback must really run",
    ),
    Mutation(
        "fast path: the check compares no gradients", FAST_PATH,
        (("        if not mismatch <= tolerance:\n            return f\"gradients differ",
          "        if False:\n            return f\"gradients differ"),),
        ("tests/test_fast_path.py", "-k", "every_row"), "issue 37: a broken backward must fail the check too",
    ),
    Mutation(
        "oneDNN linear: the bias gradient dropped", "simcse_weince/text/fast_path/onednn_linear.py",
        (("            grad_bias = grad.sum(0)", "            grad_bias = torch.zeros_like(grad[0])"),),
        ("tests/test_onednn_linear.py",), "issue 26: the same gradients as torch's linear layer",
    ),
    Mutation(
        "oneDNN linear: auto turns it on for every CPU", "simcse_weince/text/fast_path/onednn_linear.py",
        (('cpu_vendor() == "AuthenticAMD"', "cpu_vendor() is not None"),),
        ("tests/test_onednn_linear.py", "-k", "auto"), "issue 26: measured faster on AMD CPUs only",
    ),
    Mutation(
        "oneDNN linear: applied under bf16 autocast too", "simcse_weince/text/fast_path/onednn_linear.py",
        (('        and not torch.is_autocast_enabled("cpu")\n', ""),),
        ("tests/test_onednn_linear.py", "-k", "does_not_apply"), "issue 26: autocast keeps torch's bf16 kernels",
    ),
    Mutation(
        "compile: --compile leaves the encoder eager", FAST_PATH,
        (("        compiled=torch.compile(encoder.forward, dynamic=True) if speed.compile else None,",
          "        compiled=None,"),),
        ("tests/test_compile.py",), "issue 26: the flag must really compile",
    ),
    Mutation(
        "core: the hardness weighting also weighs the anchor's own hard negatives", CORE,
        (("        return columns % num_rows != rows", "        return columns >= 0"),),
        ("tests/test_infonce_hardness.py",), "sentence-transformers' in_batch_negatives mode excludes them",
    ),
    Mutation(
        "core: WEINCE's hardness term never reaches the logits", SPEEDUPS,
        (("            logits.add_(bias)", "            logits.add_(bias, alpha=0.0)"),),
        ("tests/test_infonce_hardness.py", "-k", "weince"), "issue 22: weince-hardness is Study 2's variant",
    ),
    Mutation(
        "trainers' objective: WEINCE drops hardness_strength", OBJECTIVE,
        (("gather=gather, hardness_strength=hardness_strength,",
          "gather=gather, hardness_strength=hardness_strength if loss == 'infonce' else 0.0,"),),
        ("tests/test_infonce_hardness.py", "-k", "both_losses"), "issue 22: the trainer must pass it to WEINCE",
    ),
    # ---- the shared training core (issue 11)
    Mutation(
        "vision trainer: a resumed run restarts the data at batch 0", VISION_TRAIN,
        (("self.config.seed, run.start_step, run.total_steps,",
          "self.config.seed, 0, run.total_steps - run.start_step,"),),
        ("tests/test_vision_train.py", "-k", "epoch_boundary"), "a resume must continue the data where it stopped",
    ),
    Mutation(
        "vision trainer: the epoch-start RNG draw dropped", VISION_TRAIN,
        (("                torch.empty((), dtype=torch.int64).random_()\n", "                pass\n"),),
        ("tests/test_step_losses.py", "-k", "digits"), "the augmentations of earlier releases for the same seed",
    ),
    Mutation(
        "training core: a non-finite loss does not stop the run", "simcse_weince/training/tracking.py",
        (("    if not math.isfinite(loss):", "    if False:"),),
        ("tests/test_vision_resume.py", "-k", "non_finite"), "a NaN must not reach a checkpoint",
    ),
    Mutation(
        "config: a deprecated vision name is read as itself", "simcse_weince/settings.py",
        (("            key = aliases[key]\n", "            pass\n"),),
        ("tests/test_vision_resume.py", "-k", "old_names"), "--epochs must still set num_epochs for one release",
    ),
    # ---- comparisons (issue 10)
    Mutation(
        "compare: runs paired across different seeds", "simcse_weince/compare/statistics.py",
        (("[by_cell[baseline, seed][metric] for seed in paired]", "[by_cell[baseline, seed][metric] for seed in paired[::-1]]"),),  # noqa: E501
        ("tests/test_compare_vision.py", "-k", "cli_runs"), "a paired difference compares runs of the same seed",
    ),
    Mutation(
        "vision compare: a finished cell is trained again", "simcse_weince/vision/cells.py",
        (("    results = state.results\n    if results is not None:\n        return results\n",
          "    results = None\n    if results is not None:\n        return results\n"),),
        ("tests/test_compare_vision.py", "-k", "cli_runs"), "a rerun of a sweep must train only the missing cells",
    ),
    Mutation(
        "vision trainer: crop_scale_min does not reach the augmentation", VISION_TRAIN,
        (("crop_scale=(config.crop_scale_min, 1.0)", "crop_scale=(0.08, 1.0)"),),
        ("tests/test_vision_train.py", "-k", "crop_scale"), "the protocol's milder augmentation is this setting",
    ),
    # ---- distributed
    Mutation(
        "distributed: the gathered rows carry no gradient to the other processes", FROM_EMBEDDINGS,
        (("return all_gather_with_grad(tensor.contiguous())", "return all_gather(tensor.contiguous())"),
         ("from sentence_transformers.util import all_gather_with_grad",
          "from sentence_transformers.util import all_gather")),
        ("tests/test_distributed_loss.py",), "the global-batch gradient needs every process's share",
    ),
    # ---- issue 39: received files, half-made runs, resume
    Mutation(
        "safe reader: the data-batch unpickler builds whatever a file names", "simcse_weince/safe_load.py",
        (("        found = ALLOWED.get(f\"{module}.{name}\")\n        if found is None:",
          "        found = super().find_class(module, name)\n        if found is None:"),),
        (TRUST, "-k", "imagenet32"), "issue 39.1: a crafted ImageNet-32 batch ran its payload",
    ),
    Mutation(
        "model folders: torch's refusal (which suggests weights_only=False) reaches the user",
        "simcse_weince/text/model.py",
        (("            with refusing_pickles(path):\n                encoder =",
          "            if True:\n                encoder ="),),
        (TRUST, "-k", "crafted_pickle and train"), "issue 39.7: never steer the user to the unsafe option",
    ),
    Mutation(
        "objective: settings whose logits overflow pass to step 1", OBJECTIVE,
        (("        self.check_extremes()\n", ""),),
        ("tests/test_bad_inputs.py", "-k", "underflow or overflow"), "issue 39.2: refused before any file is written",
    ),
    Mutation(
        "run folder: a start that fails before its first checkpoint leaves a half-made run", RUN_FOLDER,
        (("                        folder_io.remove(self.output_dir, self.output_dir / name)\n", "                        pass\n"),),  # noqa: E501
        ("tests/test_bad_inputs.py", "-k", "as_found"), "issue 39.2: the same command must be able to run again",
    ),
    Mutation(
        "resume: the training data's fingerprint is not compared", LOOP,
        (("        check_same_data(state, fresh, folder.checkpoint)\n", ""),),
        (TRUST, "-k", "training_data_that_changed"), "issue 39.3: --resume trained on the new file's content",
    ),
    Mutation(
        "resume: a setting that defines the run may change", "simcse_weince/settings.py",
        (("    if fixed:\n        shown", "    if False:\n        shown"),),
        (TRUST, "-k", "settings_that_define"), "issue 39.3: another --batch-size only warned",
    ),
    Mutation(
        "compare: a variant name becomes a path unchecked", "simcse_weince/paths.py",
        (("    if not isinstance(name, str) or not _FOLDER_NAME.fullmatch(name):",
          "    if not isinstance(name, str):"),),
        ("tests/test_compare.py", "-k", "leave_the_sweep"), "issue 39.4: ../x wrote cells outside the sweep folder",
    ),
    Mutation(
        "training files: a quote that runs over lines merges them silently", "simcse_weince/text/columns.py",
        (("            if reader.line_num != first_line:", "            if False:"),),
        ("tests/test_supervised.py", "-k", "quote and over and lines"), "issue 39.5: 12 data lines trained as 9 rows",
    ),
    Mutation(
        "compare: a results.json field that is not a number is used", "simcse_weince/compare/cells.py",
        (("        if not _is_number(value):\n            return f\"{value!r}, not a number\"",
          "        if False:\n            return f\"{value!r}, not a number\""),),
        ("tests/test_bad_inputs.py", "-k", "damaged_result"), "issue 39.6: 'could not convert string to float'",
    ),
    Mutation(
        "compare: the outputs are written one by one (a failure leaves them mixed)", "simcse_weince/compare/sweep.py",
        (("    except BaseException:\n        for path in staging.values():\n            path.unlink(missing_ok=True)\n        raise",  # noqa: E501
          "    except BaseException:\n        for name, path in staging.items():\n            os.replace(path, output_dir / name) if path.exists() else None\n        raise"),),  # noqa: E501
        ("tests/test_bad_inputs.py", "-k", "together_or_not"), "issue 39.6: .json/.md rewritten, the old .png kept",
    ),
    # ---- issue 24: checkpoints
    Mutation(
        "checkpoints: a checkpoint without a manifest is trusted (and its files loaded)", CHECKPOINT_FILES,
        (('        return [f"{manifest_path} is missing (a save', '        return [] and [f"{manifest_path} is missing (a save'),),  # noqa: E501
        (TRUST, "-k", "without_manifest"), "issue 24.1: a crafted extra.pt ran code on --resume",
    ),
    Mutation(
        "checkpoints: Accelerate loads the files before they are read as tensors only", CHECKPOINT_FILES,
        (("        if path.suffix in PICKLE_SUFFIXES:\n            try:", "        if False:\n            try:"),),
        (TRUST, "-k", "extra_terms"), "issue 24.1: Accelerate unpickles custom_checkpoint_*.pkl fully",
    ),
    Mutation(
        "checkpoints: a failed write is not named (the bare OSError)", CHECKPOINT_FILES,
        (("    if isinstance(error, OSError):\n        return error.strerror", "    if False:\n        return error.strerror"),),  # noqa: E501
        (TRUST, "-k", "full_disk_during_a_checkpoint"), "issue 24.4: one line naming the folder and the cause",
    ),
    Mutation(
        "checkpoints: a failed write leaves its partial .tmp", CHECKPOINT_FILES,
        (("        shutil.rmtree(partial, ignore_errors=True)\n", "        pass\n"),),
        (TRUST, "-k", "full_disk_during_a_checkpoint"), "issue 24.4: the .tmp kept the disk full for the resume",
    ),
    Mutation(
        "checkpoints: the text export does not save the last step first", LOOP,
        (('    if saved_step != run.state["step"] or checkpoint is None:\n', "    if False:\n"),),
        (TRUST, "-k", "full_disk_during_the_export"), "issue 24.4: a full disk during the export lost the last step",
    ),
    Mutation(
        "checkpoints: the RNG state is left to Accelerate, which logs a failed restore at INFO", CHECKPOINT_FILES,
        (("        _restore_rng(load_tensors(rng_path), accelerator.device.type)", "        pass"),),
        (TRUST, "-k", "rng"), "issue 24.6: Accelerate logs a failed RNG restore at INFO and resumes",
    ),
    # ---- issue 24: signals, compare, inputs
    Mutation(
        "trust B/signals: the training loop leaves SIGTERM alone (no checkpoint)", SIGNALS,
        (("STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)", "STOP_SIGNALS = (signal.SIGINT,)"),),
        ("tests/test_signals.py", "-k", "stops_train"), "issue 24.2: SIGTERM lost every step since the last checkpoint",
    ),
    Mutation(
        "trust B/signals: every interruption exits 130", SIGNALS,
        (('return 128 + getattr(interruption, "signum", int(signal.SIGINT))', "return 130"),),
        ("tests/test_signals.py", "-k", "stops_train"), "issue 24.2: SIGTERM's conventional exit code is 143",
    ),
    Mutation(
        "trust B/compare: the settings in a finished cell's results.json are not checked", CELLS,
        (('        differences.update(_differences(config, recorded, results.get("not_applied")))\n', "        pass\n"),),  # noqa: E501
        ("tests/test_bad_inputs.py", "-k", "without_its_training_config"),
        "issue 24.3: a cell without training_config.yaml was reused under other settings",
    ),
    Mutation(
        "trust B/compare: the training file's fingerprint is not compared", CELLS,
        (("            if old != new:\n", "            if False:\n"),),
        ("tests/test_bad_inputs.py", "-k", "training_file_changed"),
        "issue 24.3: new content at the same path went unnoticed",
    ),
    Mutation(
        "trust B/compare: a results.json of {} counts as a finished cell", CELLS,
        (('        return "it is empty ({})"\n', "        return None\n"),),
        ("tests/test_bad_inputs.py", "-k", "not_a_result"), "issue 24.3: the seed silently dropped out of the pairs",
    ),
    Mutation(
        "trust B/compare: each cell is checked only when its turn comes", "simcse_weince/compare/sweep.py",
        (("    states = {cell: check_cell(config, kind) for cell, config in order}",
          "    states = dict.fromkeys(configs)"),),
        ("tests/test_bad_inputs.py", "-k", "every_cell_before"), "issue 24: validate before the first cell trains",
    ),
    Mutation(
        "trust B/inputs: --seeds 1,,2 read as 1,2", "simcse_weince/compare/cli.py",
        (('    parts = [part.strip() for part in text.split(",")]\n',
          '    parts = [part.strip() for part in text.split(",") if part.strip()]\n'),),
        ("tests/test_bad_inputs.py", "-k", "seeds_are_checked"), "issue 24.5: an empty item was silently skipped",
    ),
    Mutation(
        "compare command: --output-dir optional (a sweep with no folder of its own)", "simcse_weince/compare/cli.py",
        (('        flag_options={"output_dir": OUTPUT_DIR_FLAG},\n', ""),),
        ("tests/test_compare.py", "-k", "needs_its_sweep_folder"),
        "issue 55.3: made required through add_config_flags, not argparse's private _actions",
    ),
    Mutation(
        "compare command: --preset ignored (always the kind's first preset)", "simcse_weince/compare/cli.py",
        (("kind.base_config(args.preset or kind.presets[0])", "kind.base_config(kind.presets[0])"),),
        ("tests/test_compare.py", "-k", "registers_its_compare"),
        "issue 55.1: the base config comes from the CellKind the trainer's CLI hands",
    ),
    Mutation(
        "trust B/inputs: a text seed is not range-checked (compare fails at the first set_seed)",
        "simcse_weince/text/config.py",
        (('"seed": Domain(0, 2**32,', '"seed": Domain(-(2**62), 2**32,'),),
        ("tests/test_bad_inputs.py", "-k", "api_checks_every_seed"),
        "issue 24.5: --seeds 1,-1 trained every seed-1 cell first",
    ),
    Mutation(
        "trust B/inputs: a line of zero-width characters counts as a sentence", "simcse_weince/text/data.py",
        (('[has_visible_character(text) for text in batch["text"]]', '[bool(text.strip()) for text in batch["text"]]'),),  # noqa: E501
        ("tests/test_bad_inputs.py", "-k", "zero-width or visible"), "issue 24.5: U+200B lines trained as empty",
    ),
    Mutation(
        "trust B/inputs: a FIFO, folder or socket as --train-file reported as not found", "simcse_weince/text/data.py",
        (('    for candidate in candidates:\n        check_regular_file(candidate, "training file")\n', ""),),
        ("tests/test_bad_inputs.py", "-k", "fifo-train or socket-train or directory-train"),
        "issue 24.5: the message must say what the path is",
    ),
    # ---- issue 57: tokenised batch by batch, data prepared once per machine
    Mutation(
        "data: batches tokenised when drawn are padded on the tokenizer's side", "simcse_weince/text/data.py",
        (('padding="longest",\n                                 padding_side="right",', 'padding="longest",'),),
        ("tests/test_paper_rehearsal.py", "-k", "batches_tokenised"),
        "issue 57: a left-padding tokenizer would shift every position the trainer trims",
    ),
    Mutation(
        "data: every process of a launch reads and prepares the corpus itself", TRAIN,
        (("with accelerator.local_main_process_first() if accelerator is not None", "with contextlib.nullcontext() if True"),),  # noqa: E501
        ("tests/test_paper_rehearsal.py", "-k", "small_rehearsal"),
        "issue 57: 8 processes of a node each spent minutes preparing the same 1M lines",
    ),
    # ---- issue 25: supervised training files; issue 23: one logit, lazy exports
    Mutation(
        "columns: a header's positions looked up with the spaces the check stripped", "simcse_weince/text/columns.py",
        (("order = [[name.strip() for name in header].index(name) if", "order = [header.index(name) if"),),
        ("tests/test_supervised.py", "-k", "header_names"), "'sent1 , sent0' once failed with 'sent1' not in list",
    ),
    Mutation(
        "columns: the file's column order taken for the roles", "simcse_weince/text/columns.py",
        (("            return naming[: len(names)]", "            return tuple(names)"),),
        ("tests/test_supervised.py", "-k", "header_names"), "sent1 before sent0 must not make sent1 the anchor",
    ),
    Mutation(
        "lazy exports: the submodule of the same name is handed out", "simcse_weince/_lazy.py",
        (("            namespace[name] = value\n            return value", "            return importlib.import_module(f\"{package}.{exports[name]}\")"),),  # noqa: E501
        ("tests/test_train.py", "-k", "documented_imports"), "from simcse_weince.text import train gave the module",
    ),
    Mutation(
        "core: the logit's shortfall term with the wrong sign", SPEEDUPS,
        (("log_().mul_(-shortfall_scale)", "log_().mul_(shortfall_scale)"),),
        ("tests/test_weince_reference.py",), "issue 23: the logit is written once; the authors' numbers check it",
    ),
    Mutation(
        "core: the closed-form slope misses the shortfall term", SPEEDUPS,
        (("slope = torch.div(shortfall_scale, shortfall, out=shortfall).add_(infonce_scale)",
          "slope = infonce_scale.expand_as(shortfall)"),),
        ("tests/test_weince_core.py", "-k", "hand_written_backward"), "the closed form against autograd's",
    ),
    Mutation(
        "core: the float32 preselection keeps a tie across its threshold", SPEEDUPS,
        (("    if selected.size != values.shape[0] * k:\n        return None\n", ""),),
        ("tests/test_weince_core.py", "-k", "preselection"), "issue 26: exact only without ties",
    ),
    Mutation(
        "core: the float32 preselection returns the float32 roundings", SPEEDUPS,
        (("np.compress((rounded >= kth).ravel(), values.ravel())", "np.compress((rounded >= kth).ravel(), rounded.ravel())"),),  # noqa: E501
        ("tests/test_weince_core.py", "-k", "preselection"), "issue 26: the tail statistics read float64 shortfalls",
    ),
    Mutation(
        "core: the closed-form backward skips the softmax", SPEEDUPS,
        (("grad = F.softmax(logits, dim=1)", "grad = logits.clone()"),),
        ("tests/test_weince_core.py", "-k", "hand_written_backward"), "issue 26: the backward recomputes the softmax",
    ),
    Mutation(
        "evaluation: batches sorted by characters although a tokenizer is given", ENCODERS,
        (("lengths = [len(row) for row in ids]", "lengths = [len(sentence) for sentence in sentences]"),),
        ("tests/test_evaluation.py", "-k", "token"), "issue 26: the character sort left 39% padding on STS",
    ),
    Mutation(
        "evaluation: the SentenceTransformer encoder returns rows in batch order", ENCODERS,
        (("torch.cat(parts).index_select(0, torch.argsort(order))", "torch.cat(parts)"),),
        ("tests/test_evaluation.py", "-k", "input_order_across"), "our own batches must be put back in input order",
    ),
    Mutation(
        "start-up: the text trainer imports sentence-transformers", GRADCACHE,
        (("import torch\n", "import torch\nfrom sentence_transformers.base.losses.gradcache import RandContext\n"),),
        ("tests/test_import_graph.py", "-k", "sentence_transformers"), "issue 38's move did it: seconds per run",
    ),
    Mutation(
        "WeinceLoss drops its hardness_strength before the core", COLUMNS,
        (("gather=gather_across_devices, hardness_strength=hardness_strength, directions=directions,",
          "gather=gather_across_devices, hardness_strength=0.0, directions=directions,"),),
        ("tests/test_cached_losses.py", "-k", "hardness"), "Study 2's best variant, as a sentence-transformers loss",
    ),
    # ---- FLOP utilisation and the evaluation's precision (issue 40)
    Mutation(
        "FLOPs: attention's n^2 term left out", "simcse_weince/training/flops.py",
        (("+ 4 * squares * hidden)", ")"),),
        ("tests/test_flops.py", "-k", "torch_counts"), "every MFU figure would be low by attention's share",
    ),
    Mutation(
        "FLOPs: the trainer counts one dropout view, not two", TRAIN,
        (("* (2 if len(self.columns) == 1 else 1)", "* 1"),),
        ("tests/test_flops.py", "-k", "epoch"), "unsupervised SimCSE encodes every sentence twice",
    ),
    Mutation(
        "FLOPs: the peak from the last timed call, not the best", "simcse_weince/training/flops.py",
        (("        best = min(best, time.perf_counter() - start)\n", "        best = time.perf_counter() - start\n"),),
        ("tests/test_flops.py", "-k", "fake_clock"), "one slow call on a shared machine would set the peak",
    ),
    Mutation(
        "FLOPs: a run resumed from an earlier release's checkpoint reports an MFU over part of its steps", LOOP,
        (('    if step_flops is not None and state.get("model_flops") is not None:\n',
          '    if step_flops is not None and state.setdefault("model_flops", 0) is not None:\n'),),
        ("tests/test_flops.py", "-k", "resumed"), "its earlier steps' time counted, their FLOPs not: a low MFU",
    ),
    Mutation(
        "eval_bf16 auto never evaluates in bf16", "simcse_weince/text/config.py",
        (('    return mixed_precision == "bf16" and device_type == "cpu"\n', "    return False\n"),),
        ("tests/test_precision.py", "-k", "auto or native"), "the README's run would evaluate in fp32 again",
    ),
    Mutation(
        "the final evaluation ignores eval_bf16", RESULTS,
        (("    with evaluation_autocast(eval_bf16, device):\n", "    with evaluation_autocast(False, device):\n"),),
        ("tests/test_precision.py", "-k", "eval_bf16_evaluates"), "the card would say bf16 for fp32 scores",
    ),
    # ---- issue 56: claims (i56docs)
    Mutation(
        "the README quotes one contrast with a changed mean", "README.md",
        (("beat InfoNCE: +0.04 [−0.51, +0.59], 2/0/3", "beat InfoNCE: +0.14 [−0.51, +0.59], 2/0/3"),),
        ("tests/test_doc_claims.py", "-k", "archived_cells_give"), "issue 56: the words said more than the numbers",
    ),
    Mutation(
        "doc claims: the references beside quotes are not checked", "scripts/study/doc_tables.py",
        (("in references(text) if reference[\"problem\"]]", "in references(text) if False]"),),
        ("tests/test_doc_claims.py", "-k", "planted_claim"), "a quote could name one contrast and give another",
    ),
    Mutation(
        "doc claims: a quote without a reference passes", "scripts/study/doc_tables.py",
        (("for quote in unreferenced(text)]", "for quote in unreferenced(text)[:0]]"),),
        ("tests/test_doc_claims.py", "-k", "planted_claim"), "a quote would again be checked against nothing",
    ),
    Mutation(
        "doc claims: a contrast reference accepts any quote", "scripts/study/doc_tables.py",
        (("if len(results) == 1 and key in _keys(results[0])", "if len(results) == 1 or key in _keys(results[0])"),),
        ("tests/test_doc_claims.py", "-k", "planted_claim"), "another real contrast could stand in for the named one",
    ),
    Mutation(
        "doc claims: seed counts are not compared", "scripts/study/doc_tables.py",
        (("return None if counts == set(numbers) else", "return None if counts or numbers else"),),
        ("tests/test_doc_claims.py", "-k", "planted_claim"), "a changed seed count would pass",
    ),
    Mutation(
        "doc claims: a bare W/T/L is not summed", "scripts/study/doc_tables.py",
        (("        return None if text == expected else expected\n    if kind == \"seeds\":",
          "        return None\n    if kind == \"seeds\":"),),
        ("tests/test_doc_claims.py", "-k", "planted_claim"), "a W/T/L in prose could be any three numbers",
    ),
    Mutation(
        "doc claims: README numbers outside references pass", "tests/test_doc_claims.py",
        (("if not any(low <= start < high for low, high in checked + allowed)]",
          "if not any(low <= start < high for low, high in checked + allowed) and False]"),),
        ("tests/test_doc_claims.py", "-k", "unsourced"), "a timing with no stored record could come back",
    ),
    Mutation(
        "holm: Bonferroni (every p times the family's size)", "simcse_weince/compare/statistics.py",
        (("running = max(running, min(1.0, (count - rank) * p_values[name]))",
          "running = max(running, min(1.0, count * p_values[name]))"),),
        ("tests/test_doc_claims.py", "-k", "step_down"), "issue 56: which decisions survive would be undercounted",
    ),
    # ---- the method's page: the package cites docs/method.md's headings and nothing outside the repository
    Mutation(
        "method page: a citation names a heading docs/method.md does not have", TAIL,
        # the replacement is spelled in two parts so that this file does not itself hold a broken citation
        (("(docs/method.md#step-1-the-tail-size-k)", "(docs/method.md" + "#step-1-tail-size-k)"),),
        ("tests/test_method_doc.py", "-k", "names_a_heading"), "a citation would point at nothing",
    ),
    Mutation(
        "method page: a heading the code cites is renamed", "docs/method.md",
        (("### Step 3: plotting positions and the skipped top points", "### Step 3: plotting positions and burn-in"),),
        ("tests/test_method_doc.py", "-k", "names_a_heading"), "the page and the code would drift apart",
    ),
    Mutation(
        "method page: the package cites the spec file outside the repository again", "simcse_weince/weince/__init__.py",
        (("(the method: ``docs/method.md``)", "(spec: ``../shared/docs/WEINCE.md``)"),),
        ("tests/test_method_doc.py", "-k", "outside_the_repository"), "a clone has no such file",
    ),
    Mutation(
        "method page: a hardness mode the losses accept is not defined", "docs/method.md",
        (('| `"all_negatives"` | every document but the positive: $j \\ne i$ |\n', ""),),
        ("tests/test_method_doc.py", "-k", "every_option"), "an option could ship without its definition",
    ),
    # ---- issue 54: models and inputs (i54checks)
    Mutation(
        "models: identical dropout views are let through", "simcse_weince/text/model.py",
        (("    if difference > SAME_VIEWS_TOLERANCE:\n        return\n", "    if difference >= 0:\n        return\n"),),
        ("tests/test_model_inputs.py", "-k", "identical or without_dropout"),
        "issue 54, 3: ModernBERT (every dropout 0) trained nothing, silently",
    ),
    Mutation(
        "models: --dropout sets only BERT's two dropout fields", "simcse_weince/text/model.py",
        (('        if "dropout" in name\n',
          '        if name in ("hidden_dropout_prob", "attention_probs_dropout_prob")\n'),),
        ("tests/test_model_inputs.py", "-k", "every_dropout"),
        "issue 54, 3: '--dropout 0.1' was refused for ModernBERT and DistilBERT",
    ),
    Mutation(
        "models: the views check draws from the training RNG stream", "simcse_weince/text/model.py",
        (("        with untouched_rng(device), torch.no_grad():\n", "        with torch.no_grad():\n"),),
        ("tests/test_model_inputs.py", "-k", "random_stream"), "issue 54, 3: the check would move every dropout mask",
    ),
    Mutation(
        "models: a tokenizer reading text as nothing but [UNK] is accepted", "simcse_weince/encoder_checks.py",
        (("    if not ids or (unknown is not None and all(token == unknown for token in ids)):\n",
          "    if not ids:\n"),),
        ("tests/test_model_inputs.py", "-k", "tokenizer"),
        "issue 54, 4: train exited 0 and evaluate scored 9.08 without tokenizer.json",
    ),
    Mutation(
        "models: a tokenizer larger than the embedding matrix is accepted", "simcse_weince/encoder_checks.py",
        (("    if embedding_rows is not None and vocabulary > embedding_rows:\n", "    if False:\n"),),
        ("tests/test_model_inputs.py", "-k", "small"), "issue 54, 4: ids past the embedding matrix",
    ),
    Mutation(
        "lengths: --max-length 2 ([CLS] [SEP], no text) is accepted", "simcse_weince/encoder_checks.py",
        (("    if max_length < shortest:\n", "    if max_length < shortest - 1:\n"),),
        ("tests/test_model_inputs.py", "-k", "room_for_text"), "issue 54, 6: every sentence became [CLS] [SEP]",
    ),
    Mutation(
        "lengths: rows the tokenizer left untruncated are trained on", "simcse_weince/encoder_checks.py",
        (("    if longest > max_length:\n", "    if longest > max_length + 512:\n"),),
        ("tests/test_model_inputs.py", "-k", "truncated"), "issue 54, 6: --max-length 1 left sentences whole",
    ),
    Mutation(
        "parse errors: an open quote is reported where the reader gave up", "simcse_weince/text/columns.py",
        (("                if reader.line_num > first_line:", "                if reader.line_num < first_line:"),),
        ("tests/test_supervised.py", "-k", "open"), "issue 54, 11: reported at the last line of the file",
    ),
    # ---- issue 54: run folders (i54runs)
    Mutation(
        "run folder: --overwrite moves aside every entry, the user's and the new run's inputs too", RUN_FOLDER,
        (("[name for name in _entries(output_dir) if name in owned], run_id)", "_entries(output_dir), run_id)"),),
        (RUN_FOLDERS, "-k", "overwrite_keeps"), "issue 54.1: --overwrite deleted mydata.txt and NOTES.md",
    ),
    Mutation(
        "run folder: --overwrite writes over a user's file where the new run writes", RUN_FOLDER,
        (("        if in_the_way:\n", "        if False:\n"),),
        (RUN_FOLDERS, "-k", "refuses_a_file_it_did_not_write"), "issue 54.1: anything else in the way is named",
    ),
    Mutation(
        "resume: a checkpoint of another output folder is continued", CHECKPOINT_FILES,
        (("    if checkpoint.resolve().parent != (output_dir / CHECKPOINTS).resolve():\n", "    if False:\n"),),
        (RUN_FOLDERS, "-k", "another_output_folder"), "issue 54.2: --resume B/checkpoints/step-N continued B in A",
    ),
    Mutation(
        "resume: a checkpoint of another run is continued", CHECKPOINT_FILES,
        (("    if checkpoint_run and folder_run and checkpoint_run != folder_run:\n", "    if False:\n"),),
        (RUN_FOLDERS, "-k", "saved_by_another_run"), "issue 54.2: the run id recorded at step 0 is not compared",
    ),
    Mutation(
        "lock: a second writer on the same output folder is not refused", RUN_FOLDER,
        (("                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)\n", "                pass\n"),),
        (RUN_FOLDERS, "-k", "second_writer"), "issue 54.7: two processes on one --output-dir both started",
    ),
    Mutation(
        "diagnose: --training-log is read only after the analysis", DIAGNOSE,
        (("                lambda_series(self.training_log)\n", "                pass\n"),),
        ("tests/test_diagnostics_cli.py", "-k", "before_it_writes"), "issue 54.8: old report.json beside new figures",
    ),
    Mutation(
        "diagnose: a failure leaves its staged outputs behind", DIAGNOSE,
        (("            staged.unlink(missing_ok=True)\n", "            pass\n"),),
        ("tests/test_diagnostics_cli.py", "-k", "together"), "issue 54.8: outputs replaced together or not at all",
    ),
    Mutation(
        "push: uploads every file of the folder, not only the export", "simcse_weince/hub.py",
        (("for name, kind in run_files(folder).items() if kind == \"export\")", "for name in _all(folder))"),
         ("def export_files(directory)", "def _all(folder):\n    return [p.name for p in folder.iterdir()]\n\n\n"
          "def export_files(directory)"),
         ("    if not listing_path.exists():\n", "    if True:\n")),
        (RUN_FOLDERS, "-k", "push"), "issue 54.12: push uploaded a stale .export.tmp",
    ),
    Mutation(
        "push: follows a link in the export to a file outside the run", "simcse_weince/hub.py",
        (("            if parent.is_symlink():\n", "            if False:\n"),),
        (RUN_FOLDERS, "-k", "push"), "issue 54.12: push uploaded the contents of symlinked files outside the run",
    ),
    # ---- issue 54: data parts, scores, fast path (i54data)
    Mutation(
        "ImageNet-32: a batch's images and labels not checked against each other (joined batches pair them wrongly)",
        "simcse_weince/vision/datasets.py",
        (("        if labels.ndim != 1 or len(labels) != len(data):\n", "        if labels.ndim != 1:\n"),),
        ("tests/test_vision_data.py", "-k", "imagenet32"), "issue 54 case 5: 8 images + 4 labels, then 4 + 8",
    ),
    Mutation(
        "ImageNet-32: labels outside the classes read (an IndexError at vision eval, naming no file)",
        "simcse_weince/vision/datasets.py",
        (("        outside = np.flatnonzero((labels < 1) | (labels > num_classes))\n",
          "        outside = np.flatnonzero(labels < -(10**9))\n"),),
        ("tests/test_vision_data.py", "-k", "imagenet32"), "issue 54 case 5: label 1001 of 1000 classes",
    ),
    Mutation(
        "STS gold scores off the 0-5 scale read", "simcse_weince/evaluation/data.py",
        (("    if not low <= score <= high:", "    if False:"),),
        ("tests/test_evaluation.py", "-k", "malformed"), "issue 54 class 5: a gold file's scores are one of its parts",
    ),
    Mutation(
        "compare: an archived score outside its scale is a result (an STS-B Spearman of 12,345 enters the table)",
        CELLS,
        (("        if self.low <= value <= self.high:\n", "        if True:\n"),),
        ("tests/test_compare.py", "-k", "archived or outside_its_scale"), "issue 54 case 9",
    ),
    Mutation(
        "fast path: the check runs short rows only (2-9 tokens, as before issue 54)", FAST_PATH,
        (("    longest = max(2, int(max_length))\n", "    longest = 9\n"),),
        ("tests/test_fast_path.py", "-k", "broken_release"), "issue 54 case 10: longer rows broken, the run said fast",
    ),
    Mutation(
        "fast path: the check ignores the run's precision (fp32 only)", FAST_PATH,
        (("    if mixed_precision in AUTOCAST_DTYPES:\n", "    if False:\n"),),
        ("tests/test_fast_path.py", "-k", "precision_only"), "issue 54 class 10: a bf16-only break failed step 1",
    ),
    # ---- WEINCE's statistics in SentenceTransformerTrainer's logs
    Mutation(
        "statistics callback: attached after the report_to trackers", STATISTICS_CALLBACK,
        (("            callbacks.insert(0, callback)\n", "            callbacks.append(callback)\n"),),
        ("tests/test_statistics_callback.py", "-k", "tensorboard"), "TensorBoard/W&B would log without λ",
    ),
    Mutation(
        "statistics callback: accumulation micro-batches before the last not counted", STATISTICS_CALLBACK,
        (("    def on_substep_end(self, args, state, control, **kwargs):\n        self._collect()\n", ""),),
        ("tests/test_statistics_callback.py", "-k", "mean_of_the_steps"), "λ averaged over a quarter of the batches",
    ),
    # ---- what the tool reads: prepared data keyed by content, strict JSON / YAML / step-log readers
    Mutation(
        "data: prepared lines keyed by path and mtime again (datasets' own key)", "simcse_weince/text/data.py",
        (('split="train", cache_dir=str(cache_dir))', 'split="train")'),),
        ("tests/test_train.py", "-k", "prepared_lines"), "a file rewritten with its mtime kept trains on its old lines",
    ),
    Mutation(
        "data: the in-process digest memo keyed without the ctime", "simcse_weince/provenance.py",
        (("stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns)", "stat.st_mtime_ns, stat.st_ino)"),),
        ("tests/test_train.py", "-k", "prepared_lines"), "the recorded sha256 would be the old content's",
    ),
    Mutation(
        "records: a JSON key given twice last-wins", "simcse_weince/records.py",
        (("json.loads(text, object_pairs_hook=no_duplicate_keys(source))", "json.loads(text)"),),
        ("tests/test_records.py", "-k", "twice or trust"), "compare read the second of two scores",
    ),
    Mutation(
        "records: a YAML key given twice last-wins", "simcse_weince/records.py",
        (("                    if duplicate:\n", "                    if False:\n"),),
        ("tests/test_records.py", "-k", "twice"), "a --config setting given twice applied its last value silently",
    ),
    Mutation(
        "records: a negative count accepted", "simcse_weince/records.py",
        (("    if value < minimum:\n", "    if False:\n"),),
        ("tests/test_records.py", "-k", "count or trust"), "a results.json with total_steps -3 was reused",
    ),
    Mutation(
        "records: a step logged twice kept", "simcse_weince/records.py",
        (("            if (step, name) in seen:\n", "            if False:\n"),),
        ("tests/test_records.py", "-k", "step_log"), "diagnose plotted both rows of one step",
    ),
    Mutation(
        "records: an all-NaN statistic reported as a missing column", "simcse_weince/diagnostics/plots.py",
        (("    if not series and only_nan:\n", "    if False:\n"),),
        ("tests/test_records.py", "-k", "all_nan"), "a log of NaN statistics was called a log without them",
    ),
    Mutation(
        "config: a YAML boolean where a list is expected iterated", "simcse_weince/settings.py",
        (("        if not isinstance(value, (list, tuple, str)):", "        if False:"),),
        ("tests/test_records.py", "-k", "yaml_boolean"), "final_tasks: no failed with 'bool' object is not iterable",
    ),
    Mutation(
        "tokenizer: a missing optional package not named", "simcse_weince/encoder_checks.py",
        (('    if found is None or importlib.util.find_spec("sentencepiece") is not None:', "    if True:"),),
        ("tests/test_model_inputs.py", "-k", "missing_package"), "a SentencePiece folder failed naming tiktoken",
    ),
    Mutation(
        "push: uploads the folder's listing, not the export's record", "simcse_weince/hub.py",
        (("    if not listing_path.exists():\n        return _unlisted_export_files(folder)",
          "    if True:\n        return _unlisted_export_files(folder)"),),
        ("tests/test_push_export.py", "-k", "added_inside"), "a .env added inside 1_Pooling/ was uploaded",
    ),
    Mutation(
        "push: a listed file's hash not compared", "simcse_weince/hub.py",
        (("        if size != record[\"size\"] or file_sha256(path) != record[\"sha256\"]:", "        if False:"),),
        ("tests/test_push_export.py", "-k", "not_as_the_export"), "an edited model card was uploaded as the export",
    ),
    Mutation(
        "push: the export's listing written through a link", "simcse_weince/hub.py",
        (("        temporary.unlink()  # a leftover (or a planted link): removed, not opened\n", "        pass\n"),
         ('os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)', "os.O_TRUNC")),
        ("tests/test_push_export.py", "-k", "through_a_link"), "a planted link's target was overwritten",
    ),
    Mutation(
        "domains: a numeric setting without its domain (kappa_rho)", "simcse_weince/weince/config.py",
        (('    "kappa_rho": Domain(', '    "_kappa_rho": Domain('),),
        ("tests/test_setting_domains.py", "-k", "has_a_domain or kappa_rho"), "a zero slope fixed lambda_rho at 1/2",
    ),
    Mutation(
        "domains: an open end checked as closed", "simcse_weince/validation.py",
        (("        above = value >= self.low if self.low_closed else value > self.low\n",
          "        above = value >= self.low\n"),),
        ("tests/test_setting_domains.py", "-k", "temperature"), "temperature 0 was accepted",
    ),
    # ---- the trainer's MultipleNegativesRankingLoss options (issue 53)
    Mutation(
        "train: MNRL options not checked", "simcse_weince/text/config.py",
        (("        self.check_contrastive_options()\n", ""),),
        ("tests/test_train_mnrl_options.py", "-k", "bad_value"), "a typo'd direction would fail mid-run, or not at all",
    ),
    Mutation(
        "train: --directions never reaches the loss", TRAIN,
        (("hardness_strength=config.hardness_strength, **config.contrastive_options(),",
          "hardness_strength=config.hardness_strength,"),),
        ("tests/test_train_mnrl_options.py", "-k", "run_with_the_options"), "the card would name a loss not trained",
    ),
    Mutation(
        "card: the Loss line omits the MNRL options", "simcse_weince/hub.py",
        (("contrastive_options=contrastive_options_text(config),", 'contrastive_options="",'),),
        ("tests/test_train_mnrl_options.py", "-k", "card_record"), "a symmetric-loss model's card says plain InfoNCE",
    ),
    # ---- issue 55: one name per meaning, the loss path's options validated once
    Mutation(
        "an old public name (config=, last_diagnostics) works without a FutureWarning", "simcse_weince/deprecation.py",
        (("    warnings.warn(\n", "    (lambda *args, **kwargs: None)(\n"),),
        ("tests/test_renamed_names.py",), "issue 55.5: users must learn the new name before the old one goes",
    ),
    Mutation(
        "a loss's settings not normalised at construction (directions as given)", FROM_EMBEDDINGS,
        (("        object.__setattr__(self, \"directions\", directions)\n", ""),),
        ("tests/test_renamed_names.py", "-k", "validated_once"), "issue 55.2: the options are checked once",
    ),
    # ---- the run folder, explored by random walks (tests/test_run_folder_faults.py: its scripted walks and seeds)
    Mutation(
        "lock: opened through a link planted at its path", RUN_FOLDER,
        (("            if os.path.islink(self.path):\n                raise folder_io.LinkInRunFolder(",
          "            if False:\n                raise folder_io.LinkInRunFolder("),
         ("flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC",
          "flags = os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC")),
        (WALKS, "-k", "linked_lock"), "ln -s ~/victim.txt R/.simcse-weince.lock: the victim held the lock's JSON",
    ),
    Mutation(
        "run identity: a restart from step 0 draws a new run id, the manifest keeps the old one", RUN_FOLDER,
        (("                self.run_id = folder_run_id(self.output_dir) if resume else None\n            except",
          "                self.run_id = None\n            except"),
         ('                manifest["run_id"] = run_id\n',
          '                manifest["run_id"] = manifest.get("run_id") or run_id\n')),
        (WALKS, "-k", "restart_from_step_0"), "killed before a checkpoint, resumed, killed after one: refused",
    ),
    Mutation(
        "--overwrite: a start killed before its first checkpoint drops the run it replaced", RUN_FOLDER,
        (('    if record["run_id"] in map(checkpoints.checkpoint_run_id, checkpoints.list_checkpoints(output_dir)):',
          "    if True:"),),
        (WALKS, "-k", "killed_overwrite"), "a kill before its checkpoint lost the earlier run",
    ),
    Mutation(
        "--resume: the settings compared with themselves, not with the checkpoint's record", CHECKPOINT_FILES,
        (("    saved, now = _flat(record), _flat(settings_of_record(config))",
          "    saved, now = _flat(settings_of_record(config)), _flat(settings_of_record(config))"),),
        (WALKS, "-k", "edited_settings"), "an edited seed resumed without a word",
    ),
    Mutation(
        "--resume: without run_files.json a checkpoint's run id is not compared", RUN_FOLDER,
        (('return manifest.get("run_id") or _RUN_ID_LINE', 'return manifest.get("run_id") or None and _RUN_ID_LINE'),),
        (WALKS, "-k", "another_runs_checkpoint"), "its weights continued under R",
    ),
    Mutation(
        "run folder: a link where the run writes is not refused at the start", RUN_FOLDER,
        (("                folder_io.check_entries(self.output_dir, WRITTEN)\n", "                pass\n"),),
        (WALKS, "-k", "edited_settings"), "a link at README.md: trained, then failed",
    ),
    # ---- the run folder's classes, one case each (tests/test_run_folder_cases.py)
    Mutation(
        "lock: kept by a forked child (a loader worker) after its parent is killed", RUN_FOLDER,
        (("os.register_at_fork(after_in_child=_close_locks_in_child)\n", "\n"),),
        (CASES, "-k", "forked_child"), "--num-workers 2, main process killed: the resume was refused as in use",
    ),
    Mutation(
        "lock: another host's lock file without a flock is taken over", RUN_FOLDER,
        (('        if found and found.get("host") != socket.gethostname():\n', "        if False:\n"),),
        (CASES, "-k", "another_host"), "a run on another host cannot be checked from here",
    ),
    Mutation(
        "lock: a FIFO at the lock's path is used as the lock", RUN_FOLDER,
        (("        if not stat.S_ISREG(mode):\n", "        if False:\n"),),
        (CASES, "-k", "fifo"), "mkfifo R/.simcse-weince.lock: 'File or stream is not seekable.' without a path",
    ),
    Mutation(
        "folder_io: a write follows a link inside the run folder", FOLDER_IO,
        (("        if (entry_too or index < len(parts) - 1) and os.path.islink(current):\n", "        if 0:\n"),),  # noqa: E501
        (CASES, "-k", "link_where_the_run_writes"), "a link at README.md or logs/: card and log written outside",
    ),
    Mutation(
        "--overwrite: the model it trains from is moved aside", RUN_FOLDER,
        (("        for given, where in _inputs_replaced(output_dir, inputs, owned):\n", "        for given, where in []:\n"),),  # noqa: E501
        (CASES, "-k", "model_it_trains_from"), "--model R --output-dir R --overwrite: the base model deleted",
    ),
    Mutation(
        "--overwrite: a move that fails leaves the run split between two folders", RUN_FOLDER,
        (("            for done in reversed(moved):\n", "            for done in []:\n"),),
        (CASES, "-k", "cannot_be_moved"), "chattr +i on one entry: nothing was put back",
    ),
    Mutation(
        "--resume: the checkpoint's settings of record are not compared", LOOP,
        (("        check_settings_of_record(state, run.config, folder.checkpoint)\n", ""),),
        (CASES, "-k", "checkpoints_settings"), "an edited training_config.yaml trained steps with another batch size",
    ),
    Mutation(
        "run identity: the training_config.yaml header is not read without run_files.json", RUN_FOLDER,
        (("_RUN_ID_LINE.match((output_dir", "None.match((output_dir"),),
        (CASES, "-k", "another_run_is_refused_without"), "another run's checkpoint continued under R's settings",
    ),
    Mutation(
        "export: exporting again removes a file put in an export folder", RESULTS,
        (("                if written is not None and not path.is_dir()", "                if False"),),
        (CASES, "-k", "export_folder"), "R/1_Pooling/sub/.env was deleted by the rmtree of a re-export",
    ),
    Mutation(
        "run identity: the folder's id not kept on a restart from step 0", LOOP,
        (("new_trainer_state(folder.run_id or new_run_id(),", "new_trainer_state(new_run_id(),"),),
        (CASES, "-k", "restart_from_step_0"), "killed before its first checkpoint, resumed, killed again: blocked",
    ),
    # ---- the docs speak of the project
    Mutation(
        "docs words: an issue number in a dated study record", CORRECTIONS_RECORD,
        (("after an independent audit recomputed", "after an independent audit (issue 7) recomputed"),),
        (DOCS_WORDS, "-k", "name_no_issue"), "the study records would read as a lab notebook again",
    ),
    Mutation(
        "docs words: the finder reads docs/ but not its subfolders", DOCS_WORDS,
        (("sorted((root / \"docs\").rglob(\"*.md\"))", "sorted((root / \"docs\").glob(\"*.md\"))"),),
        (DOCS_WORDS, "-k", "planted_notebook"), "docs/studies/ would escape the check",
    ),
    Mutation(
        "docs words: the README grows past its limit", "README.md",
        (("## More\n", "## More\n\nA.\n\nB.\n\nC.\n"),),
        (DOCS_WORDS, "-k", "short_enough"), "the front door would grow back into a manual",
    ),
    # ---- functions short enough to read
    Mutation(
        "function length: a diagnostic grows past 80 lines", "simcse_weince/diagnostics/ksweep.py",
        (("    ce_direct, ce_direct_se, predicted, predicted_se = _pool_plug_in(positives, negatives, temperature)\n",
          "    ce_direct, ce_direct_se, predicted, predicted_se = _pool_plug_in(positives, negatives, temperature)\n"
          + "    pass\n" * 80),),
        (FUNCTION_LENGTH, "-k", "no_function"), "k_sweep, fit_link, plot_k_sweep and run_training had grown to 91-96",
    ),
    Mutation(
        "function length: the scan skips methods and nested functions", FUNCTION_LENGTH,
        (("                visit(child, f\"{name}.\")\n", "                pass\n"),),
        (FUNCTION_LENGTH, "-k", "planted"), "a long method (a recipe's, a callback's __init__) would pass unseen",
    ),
)
# fmt: on


def copy_tree(destination: Path) -> Path:
    """The working tree (no .git, no build or run outputs) in ``destination/repo``, with ``../shared`` linked."""
    ignore = shutil.ignore_patterns(".git", "runs", "__pycache__", "*.egg-info", ".ruff_cache", ".pytest_cache")
    repo = destination / "repo"
    shutil.copytree(REPO_ROOT, repo, ignore=ignore, symlinks=True)
    shared = (REPO_ROOT / ".." / "shared").resolve()
    if shared.is_dir():
        (destination / "shared").symlink_to(shared, target_is_directory=True)
    return repo


def apply(mutation: Mutation, repo: Path) -> dict[Path, str] | None:
    """Write the mutated files; returns their original texts, or None (with a loud message) when a snippet is off
    (nothing is then written)."""
    mutated: dict[Path, str] = {}
    for edit in mutation.edits:
        path, snippet, replacement = edit if len(edit) == 3 else (mutation.path, *edit)
        target = repo / path
        text = mutated.get(target, target.read_text(encoding="utf-8") if target.is_file() else "")
        count = text.count(snippet)
        if count != 1:
            print(f"  NOT APPLIED: {path} holds {count} copies of {snippet!r} (expected exactly 1)")
            return None
        mutated[target] = text.replace(snippet, replacement)
    originals = {target: target.read_text(encoding="utf-8") for target in mutated}
    for target, text in mutated.items():
        target.write_text(text, encoding="utf-8")
    return originals


def sanity_selection(mutations) -> tuple[str, ...]:
    """One pytest run covering every mutation's selection (a superset: -k also matches module names)."""
    files, keywords = [], []
    for mutation in mutations:
        file, *rest = mutation.tests
        files.append(file)
        keywords.append(rest[1] if rest[:1] == ["-k"] else Path(file).stem)
    return (*dict.fromkeys(files), "-k", " or ".join(dict.fromkeys(keywords)))


def run_tests(mutation: Mutation, repo: Path, timeout: float) -> tuple[str, float]:
    """``(outcome, seconds)``; the last output lines of a failing run are kept in ``LAST_FAILURE`` (what a failed
    sanity run prints)."""
    global LAST_FAILURE
    env = dict(os.environ, CI="true", PYTHONPATH=str(repo), PYTHONDONTWRITEBYTECODE="1")
    env.pop("SIMCSE_WEINCE_DATA_DIR", None)  # the copy finds ../shared/data itself
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutation.tests]
    start = time.perf_counter()
    try:
        completed = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "TIMEOUT", time.perf_counter() - start
    seconds = time.perf_counter() - start
    if completed.returncode == 0:
        return "SURVIVED", seconds
    LAST_FAILURE = "\n".join((completed.stdout + completed.stderr).strip().splitlines()[-15:])
    if completed.returncode == 1:
        return "killed", seconds
    tail = "\n".join((completed.stdout + completed.stderr).strip().splitlines()[-5:])
    return f"ERROR (pytest exit {completed.returncode}):\n{tail}", seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None,
                        help="run the mutations whose name contains this text (several: separated by |)")  # fmt: skip
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutation's tests (default 600)")
    parser.add_argument("--no-sanity", action="store_true", help="skip the run of every selection without bugs")
    args = parser.parse_args(argv)
    wanted = [part.strip().lower() for part in (args.only or "").split("|") if part.strip()]
    mutations = [m for m in MUTATIONS if not wanted or any(part in m.name.lower() for part in wanted)]
    if args.list:
        for mutation in mutations:
            print(f"{mutation.name}\n    {mutation.path}: {' '.join(mutation.tests)}  ({mutation.why})")
        return 0
    if not mutations:
        print(f"no mutation matches {args.only!r}", file=sys.stderr)
        return 2

    wall_start = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="mutation-check-") as folder:
        repo = copy_tree(Path(folder))
        print(f"copied {REPO_ROOT} to {repo}; {len(mutations)} mutations", flush=True)
        if not args.no_sanity:  # a selection that fails without any bug would "kill" every mutation
            union = sanity_selection(mutations)
            outcome, seconds = run_tests(Mutation("sanity", "", (), union, ""), repo, args.timeout)
            if outcome != "SURVIVED":
                print(f"SANITY FAILED: {' '.join(union)} does not pass on the unmutated copy: {outcome}")
                print(LAST_FAILURE)
                return 1
            print(f"sanity: every test selection passes without bugs ({seconds:.0f} s)", flush=True)
        for index, mutation in enumerate(mutations, 1):
            print(f"[{index}/{len(mutations)}] {mutation.name}", flush=True)
            originals = apply(mutation, repo)
            if originals is None:
                results.append((mutation, "NOT APPLIED", 0.0))
                continue
            try:
                outcome, seconds = run_tests(mutation, repo, args.timeout)
            finally:
                for target, text in originals.items():
                    target.write_text(text, encoding="utf-8")
            print(f"  {outcome} in {seconds:.0f} s by {' '.join(mutation.tests)}", flush=True)
            results.append((mutation, outcome, seconds))

    killed = sum(outcome in ("killed", "TIMEOUT") for _, outcome, _ in results)
    wall = time.perf_counter() - wall_start
    print("\n| mutation | file | result | seconds |\n|---|---|---|---:|")
    for mutation, outcome, seconds in results:
        print(f"| {mutation.name} | {mutation.path} | {outcome.splitlines()[0]} | {seconds:.0f} |")
    print(f"\n{killed}/{len(results)} killed ({100 * killed / len(results):.0f}%); wall time {wall:.0f} s")
    not_applied = [m.name for m, outcome, _ in results if outcome == "NOT APPLIED"]
    if not_applied:
        print(f"NOT APPLIED ({len(not_applied)}): the anchors moved; update them: {'; '.join(not_applied)}")
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
