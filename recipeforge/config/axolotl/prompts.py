"""Axolotl's instruction prompters as recipe text prompts (`data.datasets[].prompt`).

The strings are Axolotl 0.19.0's, copied from `axolotl/prompters.py` (`AlpacaPrompter` and its
subclasses) and `axolotl/prompt_strategies/` (`alpaca_chat`, `alpaca_instruct`, `alpaca_w_system`,
`context_qa`, `creative_acr`, `metharme`, `user_defined`), with the fields each strategy's
`parse_instruction_fields` reads. Each prompter becomes a `prompt:` mapping (turn templates, system
texts, system format, reply template) and `columns:` renames, so the recipe writes every row as
Axolotl does; `tests/data/axolotl/fidelity/` holds the token ids Axolotl itself produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# AlpacaPrompter's system texts.
ALPACA_SYSTEM = ("Below is an instruction that describes a task, paired with an input that provides further context. "
                 "Write a response that appropriately completes the request.")
ALPACA_SYSTEM_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately "
                          "completes the request.")
# AlpacaChatPrompter / AlpacaConcisePrompter (alpaca_chat.load_qa, load_camel_ai, load_concise).
CHAT_SYSTEM = ("Below is an instruction from a USER that describes a task, paired with an input that provides further "
               "context. The ASSISTANT writes a response that concisely and appropriately completes the request.\n\n")
CHAT_SYSTEM_NO_INPUT = ("Below is an instruction from a USER that describes a task. The ASSISTANT writes a response "
                        "that appropriately and concisely completes the request.\n\n")
# AlpacaPrompter.match_prompt_style: prompt style -> (turn, turn without input, system format).
STYLES: dict[str, tuple[str, str, str]] = {
    "instruct": ("### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n",
                 "### Instruction:\n{instruction}\n\n### Response:\n", "{system}\n\n"),
    "chat": ("USER: {instruction}\n{input}\nASSISTANT:", "USER: {instruction}\nASSISTANT:", "SYSTEM: {system}\n"),
    "chatml": ("<|im_start|>user\n{instruction}\n{input}<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\n{instruction}<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>system\n{system}<|im_end|>\n"),
    "phi": ("<|user|>\n{instruction}<|end|>{input}<|assistant|>", "<|user|>\n{instruction}<|end|>\n<|assistant|>\n",
            "<|system|>\n{system}<|end|>\n"),
}
# OpenOrcaSystemDataPrompter.match_prompt_style (alpaca_w_system.load_open_orca*).
ORCA_STYLES: dict[str, tuple[str, str, str]] = {
    "instruct": ("### Human:\n{instruction}\n### Additional Context:\n{input}\n### Assistant:\n",
                 "### Human:\n{instruction}\n### Assistant:\n", "### System:\n{system}\n"),
    "chatml": STYLES["chatml"],
}
EXPLAIN_SYSTEM = "Choose the answer that best answers the question. Explain your reasoning.\n"
CONCISE_SYSTEM = "Choose the answer that best answers the question. Be concise in your response.\n\n"
CONTEXT_SYSTEM = "Use the following contextual information to concisely answer the question.\n"
CREATIVE_SYSTEM = ("Answer the following question in a comprehensive, in-depth, and creative way. Additionally your "
                   "response should be relevant, accurate, and free of any ambiguity.")
NO_CONTEXT_ANSWER = ("The context provided does not contain any information about your inquiry. Therefore, I'm unable "
                     "to answer your question based on the given context.")


@dataclass
class Prompter:
    """One Axolotl prompter with the fields its strategy reads: what the recipe needs to write its rows."""

    prompt: dict[str, Any]
    columns: dict[str, str] = field(default_factory=dict)  # recipe column -> source column
    changes: list[str] = field(default_factory=list)        # what the recipe still writes otherwise, with the fix


def _alpaca(style: str, system: str | None, system_no_input: str | None, *, with_input: bool = True,
            instruction: str = "{instruction}", table: dict | None = None) -> dict[str, Any]:
    """The prompt of an `AlpacaPrompter` in `style`; `with_input` False for strategies whose input is always
    empty (the turn without input for every row, whatever the row holds); `instruction` replaces the
    instruction placeholder where a strategy builds it from several columns."""
    turn, no_input, system_format = (table or STYLES)[style]
    no_input = no_input.replace("{instruction}", instruction)
    out: dict[str, Any] = {"turn": turn.replace("{instruction}", instruction) if with_input else no_input,
                           "turn_no_input": no_input}
    if with_input:
        if system:
            out["system"] = system
        if system_no_input != system:
            out["system_no_input"] = system_no_input or ""
    elif system_no_input:
        out["system"] = system_no_input  # the strategy never has an input: the no-input text for every row
    out["system_format"] = system_format
    return out


def prompter(kind: str, entry: dict) -> Prompter | None:
    """The prompter of Axolotl dataset type `kind` (``base[:style]`` or ``module[.load_fn]``), or None when
    the type is not an instruction prompter."""
    base, _, style = kind.partition(":")
    style = style or None
    if base in ("alpaca", "gpteacher", "oasst", "jeopardy", "explainchoice") or base == "alpaca_instruct":
        style = style or "instruct"
    if style is not None and style not in STYLES:
        return None
    if base in ("alpaca", "alpaca_instruct", "gpteacher"):
        cols = {"output": "response"} if base == "gpteacher" else {}
        return Prompter(_alpaca(style, ALPACA_SYSTEM, ALPACA_SYSTEM_NO_INPUT), cols)
    if base == "alpaca_instruct.load_no_prompt":
        return Prompter(_alpaca(style or "instruct", None, None))
    if base == "oasst":
        return Prompter(_alpaca(style, ALPACA_SYSTEM, ALPACA_SYSTEM_NO_INPUT, with_input=False),
                        {"instruction": "INSTRUCTION", "output": "RESPONSE"})
    if base == "jeopardy":  # JeopardyPrompter's own prompt_input is never used: it writes as AlpacaPrompter
        p = _alpaca(style, ALPACA_SYSTEM, ALPACA_SYSTEM_NO_INPUT)
        return Prompter({**p, "output_format": "what is {answer}"}, {"instruction": "question", "input": "category"})
    if base in ("explainchoice", "concisechoice"):
        if base == "explainchoice":
            p = _alpaca(style, EXPLAIN_SYSTEM, EXPLAIN_SYSTEM)
        else:  # MultipleChoiceConcisePrompter keeps the class's "{system}" format and the chat turns
            p = {**_alpaca("chat", CONCISE_SYSTEM, CONCISE_SYSTEM), "system_format": "{system}"}
        return Prompter(p, {"instruction": "question", "output": "explanation"},
                        [f"{base}: Axolotl writes the `choices` list into the input as lines `- \"<choice>\"`, and "
                         "reads `solution` before `explanation`; the recipe reads an `input` column as it is: build "
                         "that column in the data (and name the reply column under columns.output)"])
    if base == "summarizetldr":
        tldr = "USER: Summarize the following article as a TL;DR.\n"
        return Prompter({"turn": tldr + "{instruction}\nASSISTANT:", "turn_no_input": tldr + "{instruction}\nASSISTANT:"},
                        {"instruction": "article", "output": "summary"})
    if base == "alpaca_chat" or base == "alpaca_chat.load":
        style = str(entry.get("conversation") or style or "chat")
        if style not in STYLES:
            return None
        return Prompter(_alpaca(style, ALPACA_SYSTEM, ALPACA_SYSTEM_NO_INPUT))
    if base == "alpaca_chat.load_concise":
        return Prompter(_alpaca("chat", CHAT_SYSTEM, CHAT_SYSTEM_NO_INPUT))
    if base in ("alpaca_chat.load_qa", "alpaca_chat.load_camel_ai"):
        cols = {"instruction": "question", "output": "answer"} if base.endswith("qa") else \
            {"instruction": "message_1", "output": "message_2"}
        return Prompter(_alpaca("chat", CHAT_SYSTEM, CHAT_SYSTEM_NO_INPUT, with_input=False), cols)
    if base == "alpaca_chat.load_no_prompt":
        return Prompter(_alpaca("chat", None, None))
    if base in ("alpaca_w_system", "alpaca_w_system.load", "alpaca_w_system.load_chat",
                "alpaca_w_system.load_instruct"):
        # SystemDataPrompter: the row's `system` text, no default; the style's system format.
        p = _alpaca("instruct" if base.endswith("instruct") else "chat", None, None)
        return Prompter({**p, "row_system": True})
    if base in ("alpaca_w_system.load_open_orca", "alpaca_w_system.load_open_orca_chatml"):
        p = _alpaca("chatml" if base.endswith("chatml") else "instruct", None, None, with_input=False,
                    table=ORCA_STYLES)
        return Prompter({**p, "row_system": True},
                        {"instruction": "question", "output": "response", "system": "system_prompt"})
    if base in ("context_qa", "context_qa.load"):
        return Prompter(_alpaca("chat", CONTEXT_SYSTEM, CONTEXT_SYSTEM, with_input=False,
                                instruction="{article}\n===\n{question}"), {"output": "answer"})
    if base == "context_qa.load_404":
        return Prompter({**_alpaca("chat", CONTEXT_SYSTEM, CONTEXT_SYSTEM, with_input=False,
                                   instruction="{article}\n===\n{unanswerable_question}"),
                         "output_format": NO_CONTEXT_ANSWER})
    if base == "context_qa.load_v2":  # ContextV2Prompter: no system, the instruction as it is
        return Prompter({"turn": "Context: {context}\nQuestion: {question}\n",
                         "turn_no_input": "Context: {context}\nQuestion: {question}\n",
                         "output_format": "Answer: {answer}"})
    if base == "creative_acr.load_answer":  # CreativePrompterBase: "{system}\nUSER: ...\nASSISTANT:"
        return Prompter({"turn": "USER: {instruction}\nASSISTANT:", "turn_no_input": "USER: {instruction}\nASSISTANT:",
                         "system": CREATIVE_SYSTEM, "system_format": "{system}\n"}, {"output": "revision"})
    if base == "metharme":
        return Prompter({"turn": "{instruction}", "turn_no_input": "{instruction}"},
                        {"instruction": "prompt", "output": "generation"},
                        ["metharme: Axolotl ends each reply with three EOS tokens (two when the reply ends in one), "
                         "the recipe with one: append the other two EOS to the `generation` texts to keep them"])
    return None


def user_defined(kind: dict) -> Prompter:
    """A `type:` mapping (Axolotl's `user_defined` strategy): its formats, system prompt and field names,
    with `UserDefinedDatasetConfig`'s defaults for the keys it leaves out."""
    prompt: dict[str, Any] = {"turn": str(kind.get("format") or "{instruction} {input} "),
                              "turn_no_input": str(kind.get("no_input_format") or "{instruction} "),
                              "system_format": str(kind.get("system_format") or "{system}"), "row_system": True}
    if kind.get("system_prompt"):
        prompt["system"] = str(kind["system_prompt"])
    columns = {dst: str(kind[src]) for src, dst in (("field_instruction", "instruction"), ("field_input", "input"),
                                                     ("field_output", "output"), ("field_system", "system"))
               if kind.get(src) and kind[src] != dst}
    return Prompter(prompt, columns)
