"""The pipeline's report card (:mod:`coursepkg.training.pipeline`): ``report.md`` and
``report.html`` at the top of a run, written from each stage's ``done.json`` figures: data,
tokenizer, pretraining, fine-tuning, chat accuracy before and after, serving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["report_markdown", "write_report"]


def _budget_lines(figures: dict[str, dict[str, Any]], budget: float) -> list[str]:
    """The report's lines on time: the budget, each stage's seconds, planned against actual."""
    total = sum(f["seconds"] for f in figures.values())
    return [
        f"Budget {budget:.0f} s; the stages took {total:.1f} s ({total / budget:.2f}x the "
        "budget): " + ", ".join(f"{s} {f['seconds']:.1f} s" for s, f in figures.items()) + ".",
        "",
        *(
            f"- {s}: {figures[s]['steps']} steps, sized from this machine's measured step time "
            f"to {figures[s]['planned_seconds']:.1f} s; took {figures[s]['seconds']:.1f} s."
            for s in ("pretrain", "finetune")
            if figures[s].get("planned_seconds") is not None
        ),
    ]


def report_markdown(run: Path, figures: dict[str, dict[str, Any]], budget: float) -> str:
    """The report card as markdown.

    Args:
        run: the run's folder.
        figures: each stage's ``done.json`` but the report's, in the order they ran.
        budget: the run's budget in seconds.

    Returns:
        The markdown text.
    """
    corpus, tok, pre = figures["corpus"], figures["tokenizer"], figures["pretrain"]
    chat, ft, ev = figures["chat_data"], figures["finetune"], figures["evaluate"]
    model_tok = pre.get("tokenizer") or {  # a run from before the model's tokenizer was recorded
        "name": "GPT-2",
        "vocab_size": 50257,
        "bytes_per_token": tok["gpt2_bytes_per_token"],
    }
    lines = [
        f"# Report card: {run.name}",
        "",
        *_budget_lines(figures, budget),
        "",
        "## Data",
        f"Source: {corpus['source']}.",
        "",
        "| split | characters | bytes |",
        "|---|---|---|",
        *(f"| {s} | {r['chars']:,} | {r['bytes']:,} |" for s, r in corpus["splits"].items()),
        "",
        "## Tokenizer",
        f"A byte-level BPE of {tok['merges']:,} merges learned on {tok['trained_on_chars']:,} "
        f"characters: {tok['bytes_per_token']:.2f} held-out bytes per token against GPT-2's "
        f"{tok['gpt2_bytes_per_token']:.2f} (50,000 merges).",
        f"**The model's tokenizer: {model_tok['name']}**, {model_tok['vocab_size']:,} ids, "
        f"{model_tok['bytes_per_token']:.2f} held-out bytes per token; `coursepkg finetune`, "
        "the evaluation and `coursepkg serve` read it from the run.",
        f"Longest learned tokens: {', '.join(repr(t) for t in tok['longest_tokens'])}.",
        "",
        "## Pretraining",
        f"{pre['parameters']:,} parameters ({pre['model']}), {pre['steps']} steps: training "
        f"loss {pre['train_loss']:.3f}, held-out loss {pre['val_loss']:.3f}; **held-out bits "
        f"per byte {pre['heldout_bits_per_byte']:.3f}** on the corpus' held-out documents.",
        "",
        "![loss curves](pretrain/loss.png)",
        "",
        "Sample:",
        "",
        "```",
        pre["sample"],
        "```",
        "",
        "## Fine-tuning",
        f"SFT for {ft['steps']} steps on generated conversations "
        + ", ".join(f"{t}: {c['train']}" for t, c in chat["tasks"].items())
        + f"; final loss {ft['final_loss']:.3f}.",
        "",
        *_accuracy_lines(ev),
        "## Serving",
        f"`coursepkg serve {run / 'finetune'}` serves the chat model over the OpenAI API and a "
        "chat page.",
        "",
        *_serving_lines(figures.get("serve")),
    ]
    return "\n".join(lines)


def _accuracy_lines(ev: dict[str, Any]) -> list[str]:
    """The report's chat accuracy before and after fine-tuning, and a few answers."""
    return [
        "## Chat accuracy on held-out prompts (greedy, exact answer)",
        "",
        "| task | prompts | before (base) | after (chat) |",
        "|---|---|---|---|",
        *(
            f"| {t} | {n} | {ev['accuracy']['before'][t]:.0%} | {ev['accuracy']['after'][t]:.0%} |"
            for t, n in ev["heldout_prompts"].items()
        ),
        "",
        f"Held-out bits per byte: base {ev['heldout_bits_per_byte']['before']:.3f}, chat "
        f"{ev['heldout_bits_per_byte']['after']:.3f}.",
        "",
        "| task | prompt | expected | the chat model said |",
        "|---|---|---|---|",
        *(
            f"| {e['task']} | {e['prompt']} | {e['answer']} | {e['said'] or '(nothing)'} |"
            for e in ev["examples"]
        ),
        "",
    ]


def _serving_lines(serve: dict[str, Any] | None) -> list[str]:
    """The report's serving figures (none for a run that skipped the measurement)."""
    if not serve or serve.get("skipped"):
        return [f"Not measured in this run ({serve['skipped']})." if serve else ""]
    alone, together = serve["one at a time"], serve["all at once"]
    return [
        f"Measured through the `openai` client: {serve['requests']} held-out prompts, greedy, "
        f"at most {serve['max_tokens']} tokens each, {serve['rounds']} alternated rounds. "
        f"**{serve['greedy_equal']} of {serve['requests']}** served answers equal the model's "
        "answer generated offline for that request alone (in every round).",
        "",
        "| sent | tokens/s | latency p50 | latency p99 | first text p50 | first text p99 |",
        "|---|---|---|---|---|---|",
        *(
            f"| {label} | {f['tokens_per_second']:.1f} | {f['latency_p50']:.3f} s | "
            f"{f['latency_p99']:.3f} s | {f['ttft_p50']:.3f} s | {f['ttft_p99']:.3f} s |"
            for label, f in (("one at a time", alone), ("all at once", together))
        ),
        "",
        f"Throughput all at once / one at a time: **{serve['ratio']:.2f}x** (continuous "
        "batching; wall clock, client and server on this machine).",
        "",
    ]


def write_report(run: Path, figures: dict[str, dict[str, Any]], budget: float) -> dict[str, Any]:
    """Write ``report.md`` and ``report.html`` at the top of the run.

    Args:
        run: the run's folder.
        figures: as :func:`report_markdown` takes them.
        budget: the run's budget in seconds.

    Returns:
        ``{"files": [...]}``, the report stage's figures.
    """
    from markdown_it import MarkdownIt

    text = report_markdown(run, figures, budget)
    (run / "report.md").write_text(text, encoding="utf-8")
    body = MarkdownIt("commonmark").enable("table").render(text)
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{run.name}</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}"
        f"</style></head><body>{body}</body></html>"
    )
    (run / "report.html").write_text(page, encoding="utf-8")
    return {"files": ["report.md", "report.html"]}
