"""GPU checks for a session with a lent accelerator; run through ``scripts/device/device_check.sh``.

Writes one JSON (``--output``, default ``$OUT/device_check.json`` or ``./device_check.json``) with one entry per
check: ``{"ok": bool, ...numbers}`` or ``{"skipped": reason}``. Needs torch, transformers, sentence-transformers
and accelerate only; every model is built from a ``BertConfig`` (no Hub), the tokenizer from a word list.

1. ``core_topk``: the CUDA ``torch.topk`` branch of the loss core against the CPU branch (numpy partition), on the
   same float32 embeddings: loss, gradients and tail statistics.
2. ``autocast_bf16`` / ``autocast_fp16``: the loss under autocast is finite, its statistics are float32, and it
   is close to the float32 loss; a tiny-BERT CachedWeinceLoss step under autocast is finite.
3. ``cached_rng_replay``: CachedWeinceLoss with dropout on, on the device: the backward pass re-embeds every
   mini-batch bitwise equal to the first pass (device RNG replayed), and the gradients equal a chunked reference.
4. ``loss_timing``: forward+backward of WEINCE against InfoNCE at simclr 2x256x128 and simcse 512x512x768
   (device events, interleaved, median; the paper: 0.65 -> 2.11 ms on an L40S).
5. ``trainer_step``: the trainer's ``forward_backward`` under Accelerate (plain and GradCache, bf16), then
   ``train()`` for two steps when ``datasets`` is installed.
6. ``flop_utilisation``: the trainer's step (its checked fast forward, WEINCE, AdamW) on a randomly initialised
   BERT-base (a 2-layer, 128-wide BERT in the CPU dry run) over 64 sentences of 12 to 32 tokens, in fp32 and bf16
   (where native): model FLOPs
   of the real tokens (``simcse_weince/training/flops.py``), step time, achieved FLOP/s and their fraction of the
   device's measured matmul peak at the same precision (MFU).

``--cpu-dry-run`` runs everything that does not need a GPU on the CPU (smaller timing repeats, no fp16).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SENTENCES = [
    "a man is playing a guitar on the stage",
    "the cat sleeps on the warm sofa all day",
    "stocks fell sharply on monday after the report",
    "she is reading a book in the park",
    "the river flows through the old city",
    "children are playing football in the street",
    "the new bridge was opened in the spring",
    "he drove to work in the morning rain",
    "a woman is slicing an onion in the kitchen",
    "the museum holds paintings from the last century",
    "the team won the final match of the season",
    "rain is expected across the north tomorrow",
]


def tiny_bert_folder(folder: Path, hidden_dropout: float = 0.1) -> Path:
    """A 2-layer, 32-wide BERT (seed 0) and a WordPiece tokenizer over the words of SENTENCES, saved to folder."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    words = sorted({word for sentence in SENTENCES for word in sentence.split()})
    vocab = {token: index for index, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    # built through `tokenizers`: transformers 5's BertTokenizerFast(vocab_file=...) ignores the file and keeps
    # only the 5 special tokens (the received-model check refuses such a tokenizer)
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]",
    )  # fmt: skip
    config = BertConfig(
        vocab_size=len(words) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=hidden_dropout,
        attention_probs_dropout_prob=hidden_dropout,
    )  # fmt: skip
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def sentence_transformer(folder: Path, device: str):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    transformer = Transformer(str(folder), max_seq_length=32)
    return SentenceTransformer(modules=[transformer, Pooling(32, pooling_mode="mean")], device=device)


def _embeddings(num_anchors, num_candidates, dim, device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    anchors = torch.randn(num_anchors, dim, generator=generator)
    candidates = torch.randn(num_candidates, dim, generator=generator)
    paired = min(num_anchors, num_candidates)
    candidates[:paired] += 0.5 * anchors[:paired]
    return anchors.to(device), candidates.to(device)


def check_core_topk(device: str) -> dict:
    """The device top-k branch of the core against the CPU branch on the same float32 inputs."""
    from simcse_weince import WeinceConfig, weince_loss

    results = {}
    for geometry, rows, dim in (("simcse", 256, 64), ("simclr", 128, 32)):
        anchors, candidates = _embeddings(rows, rows, dim, "cpu")
        outputs = {}
        for where in ("cpu", device):
            a = anchors.clone().to(where).requires_grad_()
            c = candidates.clone().to(where).requires_grad_()
            loss, stats = weince_loss(
                a, c, temperature=0.05, geometry=geometry, weince=WeinceConfig(), return_stats=True
            )
            loss.backward()
            outputs[where] = (loss.detach().cpu(), a.grad.cpu(), c.grad.cpu(), stats["mixing_weight"].cpu())
        cpu, dev = outputs["cpu"], outputs[device]
        differences = [float((x - y).abs().max()) for x, y in zip(cpu, dev)]
        results[geometry] = {
            "branch": "torch.topk" if device != "cpu" else "numpy partition (both sides: dry run)",
            "loss_difference": differences[0],
            "grad_difference": max(differences[1:3]),
            "lambda_difference": differences[3],
        }
        results[geometry]["ok"] = differences[0] <= 1e-4 and max(differences[1:3]) <= 1e-4 and differences[3] <= 1e-3
    return {"ok": all(r["ok"] for r in results.values()), **results}


def check_autocast(device: str, dtype: torch.dtype, folder: Path) -> dict:
    from simcse_weince import CachedWeinceLoss, weince_loss

    anchors, candidates = _embeddings(512, 512, 768, device)
    reference = weince_loss(anchors, candidates, temperature=0.05).item()
    a, c = anchors.clone().requires_grad_(), candidates.clone().requires_grad_()
    with torch.autocast(device_type=torch.device(device).type, dtype=dtype):
        loss, stats = weince_loss(a.to(dtype), c.to(dtype), temperature=0.05, return_stats=True)
    loss.backward()
    result = {
        "loss": loss.item(),
        "float32_loss": reference,
        "loss_dtype": str(loss.dtype),
        "statistics_dtype": str(stats["mixing_weight"].dtype),
        "grads_finite": bool(torch.isfinite(a.grad).all() and torch.isfinite(c.grad).all()),
    }
    model = sentence_transformer(folder, device)
    model.train()
    cached = CachedWeinceLoss(model, mini_batch_size=5)
    with torch.autocast(device_type=torch.device(device).type, dtype=dtype):
        step_loss = cached([model.preprocess(SENTENCES)])
    step_loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    result["cached_step_loss"] = step_loss.item()
    result["cached_step_grads_finite"] = bool(grads) and all(bool(torch.isfinite(g).all()) for g in grads)
    result["ok"] = (
        abs(result["loss"] - reference) <= 0.05 * abs(reference)
        and result["statistics_dtype"] in ("torch.float32", "torch.float64")
        and result["grads_finite"]
        and result["cached_step_grads_finite"]
        and bool(torch.isfinite(step_loss))
    )
    return result


def check_cached_rng_replay(device: str, folder: Path) -> dict:
    from sentence_transformers.base.losses.gradcache import _create_minibatch

    from simcse_weince import CachedWeinceLoss, WeinceLoss

    model = sentence_transformer(folder, device)
    model.train()
    loss_fn = CachedWeinceLoss(model, mini_batch_size=5)
    passes = {"first": [], "second": []}
    sink = passes["first"]
    embed_minibatch = loss_fn.embed_minibatch

    def spy(**kwargs):
        reps, random_state = embed_minibatch(**kwargs)
        sink.append(reps.detach().clone())
        return reps, random_state

    loss_fn.embed_minibatch = spy
    features = [model.preprocess(SENTENCES)]
    torch.manual_seed(0)
    loss = loss_fn([dict(features[0])])
    sink = passes["second"]
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    bitwise = len(passes["first"]) == len(passes["second"]) > 0 and all(
        torch.equal(x, y) for x, y in zip(passes["first"], passes["second"])
    )
    views_differ = not torch.equal(torch.cat(passes["first"][:3]), torch.cat(passes["first"][3:]))

    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    column = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in features[0].items()}
    embeddings = []
    for _ in range(2):  # the two dropout passes of the single column, chunk by chunk, with gradient
        embeddings.append(
            torch.cat(
                [
                    model(_create_minibatch(column, begin, begin + 5))["sentence_embedding"]
                    for begin in range(0, len(SENTENCES), 5)
                ]
            )
        )
    expected = WeinceLoss(model).compute_loss_from_embeddings(embeddings)
    expected.backward()
    scale = max(g.abs().max().item() for g in grads.values())
    difference = max((grads[n] - p.grad).abs().max().item() for n, p in model.named_parameters() if n in grads)
    return {
        "device": device,
        "mini_batches": len(passes["first"]),
        "second_pass_bitwise_equal": bitwise,
        "dropout_views_differ": views_differ,
        "loss": loss.item(),
        "reference_loss": expected.item(),
        "max_grad_difference_over_largest": difference / scale,
        "ok": bitwise and views_differ and difference <= 1e-5 * scale,
    }


def check_loss_timing(device: str, repeats: int) -> dict:
    from simcse_weince import infonce_loss, weince_loss

    sizes = [("simclr 2x256x128", "simclr", 256, 256, 128), ("simcse 512x512x768", "simcse", 512, 512, 768)]
    cuda = torch.device(device).type == "cuda"
    results = {}
    for label, geometry, rows, columns, dim in sizes:
        anchors, candidates = _embeddings(rows, columns, dim, device)
        anchors.requires_grad_()
        candidates.requires_grad_()

        def run(loss_fn, anchors=anchors, candidates=candidates, geometry=geometry):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                loss_fn(anchors, candidates, temperature=0.05, geometry=geometry).backward()
                end.record()
                torch.cuda.synchronize()
                return start.elapsed_time(end)
            begin = time.perf_counter()
            loss_fn(anchors, candidates, temperature=0.05, geometry=geometry).backward()
            return 1e3 * (time.perf_counter() - begin)

        for _ in range(5):
            run(weince_loss), run(infonce_loss)
        weince, infonce = [], []
        for repeat in range(repeats):
            order = (weince_loss, infonce_loss) if repeat % 2 else (infonce_loss, weince_loss)
            for loss_fn in order:
                (weince if loss_fn is weince_loss else infonce).append(run(loss_fn))
        results[label] = {
            "weince_ms": statistics.median(weince),
            "infonce_ms": statistics.median(infonce),
            "ratio": statistics.median(weince) / statistics.median(infonce),
            "repeats": repeats,
        }
    return {"ok": True, "device": device, "paper_l40s_ms": {"infonce": 0.65, "weince": 2.11}, **results}


def check_trainer_step(device: str, folder: Path, cpu_dry_run: bool) -> dict:
    from accelerate import Accelerator

    from simcse_weince.compat import reset_accelerate_state
    from simcse_weince.losses.from_embeddings import ContrastiveObjective
    from simcse_weince.text.data import PaddingCollator
    from simcse_weince.text.model import SimCSEModel
    from simcse_weince.text.trainer import forward_backward

    result = {}
    mixed_precision = "bf16" if (cpu_dry_run or torch.cuda.is_bf16_supported()) else "fp16"
    for precision in ("no", mixed_precision):
        # Accelerate keeps its settings in process-wide singletons: start each precision from a clean state
        reset_accelerate_state(reset_partial_state=True)
        accelerator = Accelerator(cpu=cpu_dry_run, mixed_precision=precision)
        torch.manual_seed(0)
        model = SimCSEModel.from_pretrained(str(folder), pooler="cls", dropout=0.0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer = accelerator.prepare(model, optimizer)
        tokenizer = accelerator.unwrap_model(model).tokenizer
        collate = PaddingCollator(tokenizer.pad_token_id)
        batch = collate([tokenizer(s, truncation=True, max_length=32) for s in SENTENCES])
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        objective = ContrastiveObjective("weince", 0.05)
        losses = {}
        for mini_batch_size in (None, 5):
            optimizer.zero_grad(set_to_none=True)
            loss, _ = forward_backward(model, batch, objective, accelerator, mini_batch_size)
            grads = [p.grad.float() for p in model.parameters() if p.grad is not None]
            losses[str(mini_batch_size)] = {
                "loss": loss.item(),
                "grad_norm": float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))),
            }
        optimizer.step()
        whole, cached = losses["None"], losses["5"]
        result[precision] = {
            "device": str(accelerator.device),
            "whole_batch": whole,
            "mini_batch_5": cached,
            "ok": abs(whole["loss"] - cached["loss"]) <= (1e-4 if precision == "no" else 2e-2) * abs(whole["loss"])
            and abs(whole["grad_norm"] - cached["grad_norm"]) <= 0.05 * whole["grad_norm"],
        }
    try:
        import datasets  # noqa: F401
    except ImportError:
        result["train"] = {"skipped": "datasets is not installed here: train() not run"}
    else:
        from simcse_weince.text.config import preset
        from simcse_weince.text.trainer import train

        with tempfile.TemporaryDirectory() as tmp:
            train_file = Path(tmp) / "train.txt"
            train_file.write_text("\n".join(SENTENCES * 4) + "\n")
            config = preset(
                "paper", model=str(folder), train_file=str(train_file), batch_size=8, mini_batch_size=3, max_steps=2,
                eval_steps=0, save_steps=0, final_evaluation=False, report_to=[], cpu=cpu_dry_run,
                mixed_precision=mixed_precision, output_dir=str(Path(tmp) / "run"),
            )  # fmt: skip
            begin = time.perf_counter()
            results = train(config)
            result["train"] = {
                "losses": [entry["loss"] for entry in results["history"]],
                "device": results["device"],
                "mixed_precision": mixed_precision,
                "seconds": time.perf_counter() - begin,
                "ok": len(results["history"]) == 2 and all(map(_finite, (e["loss"] for e in results["history"]))),
            }
    result["ok"] = all(entry.get("ok", True) for entry in result.values() if isinstance(entry, dict))
    return result


def check_flop_utilisation(device: str, folder: Path, cpu_dry_run: bool) -> dict:
    from transformers import AutoTokenizer, BertConfig, BertModel

    from simcse_weince.losses.from_embeddings import ContrastiveObjective
    from simcse_weince.precision import resolve_mixed_precision
    from simcse_weince.text.config import SpeedConfig, resolve_length_chunks
    from simcse_weince.text.fast_path import build_training_forward
    from simcse_weince.text.model import SimCSEModel
    from simcse_weince.text.trainer import forward_backward
    from simcse_weince.training.flops import PEAK_DTYPES, encoder_training_flops, matmul_peak_flops

    class NoAccelerator:  # forward_backward's one use of the accelerator
        @staticmethod
        def backward(loss):
            loss.backward()

    sizes = (128, 2, 512) if cpu_dry_run else (768, 12, 3072)  # a small BERT / BERT-base
    warmup, steps = (1, 2) if cpu_dry_run else (3, 10)
    config = BertConfig(hidden_size=sizes[0], num_hidden_layers=sizes[1], intermediate_size=sizes[2],
                        num_attention_heads=sizes[0] // 64, vocab_size=30522)  # fmt: skip
    # bf16 where the device computes it natively (emulated bf16 on a CPU takes minutes a step)
    precisions = ("no", "bf16") if resolve_mixed_precision("auto", device) == "bf16" else ("no",)
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(12, 33, (64,), generator=generator)
    ids = torch.randint(1000, 30000, (64, 32), generator=generator)
    mask = (torch.arange(32).unsqueeze(0) < lengths.unsqueeze(1)).long()
    batch = {"input_ids": (ids * mask).to(device), "attention_mask": mask.to(device)}
    flops_per_step = encoder_training_flops(config, lengths.tolist() * 2, head=True)
    result = {"model": dict(zip(("hidden", "layers", "feed_forward"), sizes)), "sentences": 64,
              "real_tokens": int(lengths.sum()), "model_gflop_per_step": flops_per_step / 1e9}  # fmt: skip
    for precision in precisions:
        torch.manual_seed(0)
        model = SimCSEModel(BertModel(config), AutoTokenizer.from_pretrained(str(folder)), pooler="cls").to(device)
        model.training_forward = build_training_forward(
            model.encoder, SpeedConfig(), length_chunks=resolve_length_chunks("auto", precision, device),
            mixed_precision=precision, max_length=32, device_type=device,
        )  # fmt: skip
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        objective = ContrastiveObjective("weince", 0.05)
        autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16")
        for index in range(warmup + steps):
            if index == warmup:
                if device == "cuda":
                    torch.cuda.synchronize()
                begin = time.perf_counter()
            with autocast:
                forward_backward(model, batch, objective, NoAccelerator())
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - begin) / steps
        peak = matmul_peak_flops(PEAK_DTYPES[precision], device, seconds=1.0)
        achieved = flops_per_step / seconds
        result["fp32" if precision == "no" else "bf16"] = {
            "step_ms": 1e3 * seconds, "achieved_tflops": achieved / 1e12, "peak_tflops": peak / 1e12,
            "mfu": achieved / peak, "training_forward": model.training_forward.report["path"],
        }  # fmt: skip
    if "bf16" not in precisions:
        result["bf16"] = {"skipped": f"bf16 is not native on this {device}"}
    result["ok"] = all(0 < entry["mfu"] < 1 for entry in (result["fp32"], result["bf16"]) if "mfu" in entry)
    return result


def _finite(value: float) -> bool:
    return value == value and abs(value) != float("inf")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="run the CPU-possible parts on the CPU")
    parser.add_argument("--output", default=None, help="the JSON file (default $OUT/device_check.json)")
    parser.add_argument("--repeats", type=int, default=None, help="timing repeats (default 50 on GPU, 10 on CPU)")
    args = parser.parse_args(argv)
    output = Path(args.output or Path(os.environ.get("OUT", ".")) / "device_check.json")
    has_cuda = torch.cuda.is_available()
    if not has_cuda and not args.cpu_dry_run:
        print("no CUDA device: run with --cpu-dry-run for the CPU-possible parts", file=sys.stderr)
        return 2
    device = "cpu" if args.cpu_dry_run else "cuda"
    repeats = args.repeats or (10 if device == "cpu" else 50)
    report = {
        "mode": "cpu-dry-run" if args.cpu_dry_run else "cuda",
        "device_name": torch.cuda.get_device_name(0) if has_cuda and not args.cpu_dry_run else platform.processor(),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "checks": {},
    }
    try:
        import sentence_transformers
        import transformers

        report["versions"]["transformers"] = transformers.__version__
        report["versions"]["sentence_transformers"] = sentence_transformers.__version__
    except ImportError:
        pass
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_bert_folder(Path(tmp) / "tiny-bert")
        checks = {
            "core_topk": lambda: check_core_topk(device),
            "autocast_bf16": lambda: check_autocast(device, torch.bfloat16, folder),
            "autocast_fp16": (
                (lambda: {"skipped": "fp16 autocast is a GPU check"})
                if device == "cpu"
                else (lambda: check_autocast(device, torch.float16, folder))
            ),
            "cached_rng_replay": lambda: check_cached_rng_replay(device, folder),
            "loss_timing": lambda: check_loss_timing(device, repeats),
            "trainer_step": lambda: check_trainer_step(device, folder, args.cpu_dry_run),
            "flop_utilisation": lambda: check_flop_utilisation(device, folder, args.cpu_dry_run),
        }
        for name, check in checks.items():
            begin = time.perf_counter()
            try:
                report["checks"][name] = check()
            except Exception as error:  # one failed check must not hide the others
                report["checks"][name] = {
                    "ok": False,
                    "error": repr(error),
                    "traceback": traceback.format_exc()[-3000:],
                }
            report["checks"][name]["seconds"] = round(time.perf_counter() - begin, 2)
            print(f"{name}: {'skipped' if 'skipped' in report['checks'][name] else report['checks'][name].get('ok')}",
                  file=sys.stderr, flush=True)  # fmt: skip
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["ok"] = all(check.get("ok", True) for check in report["checks"].values())
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"wrote {output} (all ok: {report['ok']})", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
