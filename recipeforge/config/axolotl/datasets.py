"""Axolotl dataset entries (`datasets:`, `test_datasets:`, `pretraining_dataset:`) as recipe datasets.

Axolotl names a prompt strategy per dataset (`type:`); recipeforge names a row layout (`format:`) and
renames columns with `columns:`. Each entry key is mapped or reported as ``datasets[i].key``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipeforge.config.axolotl.chat_templates import (
    CHAT_TEMPLATES,
    INLINE_JINJA,
    chat_template_key,
    jinja_key,
)
from recipeforge.config.axolotl.prompts import Prompter, prompter, user_defined
from recipeforge.config.axolotl.values import num
from recipeforge.json_value import JSONValue

if TYPE_CHECKING:
    from recipeforge.config.axolotl.conversion import Conversion

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")
ENTRY_KEYS = ("path", "split", "name", "type")
PER_DATASET_IGNORED = {
    "ds_type": "recipeforge tells json/parquet/csv/text files apart by their extension",
    "data_files": "recipeforge reads `path` (a file, a directory or a hub id) whole; point path at the file",
    "revision": "datasets have no revision key; `recipeforge resolve --lock` records the hub commit in use",
    "shards": "no counterpart; use max_samples to train on part of a dataset",
    "shards_idx": "no counterpart; use max_samples to train on part of a dataset",
    "preprocess_shards": "no counterpart; data.num_proc parallelises tokenization",
    "trust_remote_code": "datasets never run remote code in recipeforge",
    "chat_template_jinja": INLINE_JINJA,
}
# Dataset keys whose setting changes which tokens train, where the recipe has no counterpart: reported as
# semantic changes, with what the recipe trains instead.
TRAINING_KEYS = {
    "drop_system_message": "Axolotl leaves system messages out of the rows; the recipe keeps them (in the "
                           "untrained prompt): remove them from the data to train as Axolotl does",
    "train_on_eos": "the recipe trains the end-of-turn of each trained assistant reply (Axolotl's `turn`); other "
                    "values have no counterpart",
    "train_on_eot": "the recipe trains the end-of-turn of each trained assistant reply (Axolotl's `turn`); other "
                    "values have no counterpart",
    "message_field_training_detail": "Axolotl trains the marked character spans of a message; the recipe trains a "
                                     "message whole or not at all (messages.train_field)",
}


def raw_text_only(conv: Conversion) -> bool:
    """Whether every dataset is raw text (`completion` or `pretrain` type): a pretraining run."""
    entries = conv.get("datasets") or []
    return bool(entries) and all(isinstance(e, dict) and str(e.get("type")) in ("completion", "pretrain")
                                 for e in entries)


def data(conv: Conversion) -> None:
    """`data:` of the recipe: datasets, eval datasets, and the data keys at the top level."""
    out = []
    pre = conv.get("pretraining_dataset")
    if pre:
        for i, entry in enumerate(pre if isinstance(pre, list) else [pre]):
            out.append(_pretraining(conv, entry, f"pretraining_dataset[{i}]"))
        conv.map("pretraining_dataset", "data.datasets")
        conv.put("data.streaming", True)  # Axolotl streams its pretraining datasets too (max_steps required)
    for i, entry in enumerate(conv.get("datasets") or []):
        out.append(_entry(conv, entry, f"datasets[{i}]"))
    if conv.get("datasets"):
        conv.map("datasets", "data.datasets")
    conv.put("data.datasets", out)
    evals = [_entry(conv, e, f"test_datasets[{i}]") for i, e in enumerate(conv.get("test_datasets") or [])]
    if evals:
        conv.put("data.eval_datasets", evals, "test_datasets")
    val = conv.get("val_set_size")
    if val is not None:
        if evals and val:
            conv.note("val_set_size", "test_datasets are set too; recipeforge takes one of them (eval_datasets)")
        else:
            val = num(val, float, "val_set_size")
            conv.put("data.val_size", int(val) if val >= 1 else val, "val_set_size")
    if conv.get("sample_packing") is None and conv.recipe["stage"] == "pretrain" and not pre:
        conv.put("data.packing", False)  # Axolotl packs only with sample_packing; recipeforge's pretrain default packs
    for src, dst in (("sample_packing", "packing"), ("train_on_inputs", "train_on_inputs"),
                     ("shuffle_merged_datasets", "shuffle"), ("dataset_prepared_path", "cache_dir")):
        if conv.get(src) is not None:
            conv.put(f"data.{dst}", conv.get(src), src)
    num_proc = conv.get("dataset_num_proc", conv.get("dataset_processes"))
    if num_proc is not None:
        conv.put("data.num_proc", num(num_proc, int, "dataset_num_proc"), "dataset_num_proc" if conv.get("dataset_num_proc") else
                 "dataset_processes")
    if conv.get("dataset_prepared_path") is not None:
        conv.note("dataset_prepared_path", "used as data.cache_dir; recipeforge's cache is its own (Axolotl's "
                                           "prepared data is not reused)")
    if conv.get("pad_to_sequence_len") is not None:
        conv.note("pad_to_sequence_len", "no counterpart; batches are padded to their longest row, and packing "
                                         "(data.packing) fills sequences to data.sequence_len")
    for src in ("eval_sample_packing", "sample_packing_eff_est", "sample_packing_group_size",
                "sample_packing_bin_size", "total_num_tokens", "group_by_length",
                "curriculum_sampling"):
        if conv.get(src) is not None:
            conv.note(src, "no counterpart; recipeforge packs (data.packing) or pads each batch on its own")
    _excess_length(conv)
    if conv.get("streaming") is not None:
        conv.put("data.streaming", bool(conv.get("streaming")) or bool(pre), "streaming")
    template = conv.get("chat_template")
    if template is not None:
        chat_template_key(conv, template, "chat_template")
    _tokens(conv)
    if conv.get("dataset_exact_deduplication") is not None:
        conv.put("data.dedup", bool(conv.get("dataset_exact_deduplication")), "dataset_exact_deduplication")
    system = conv.get("default_system_message")
    if system is not None:
        chats = [d for d in out if d.get("format") == "messages"]
        for d in chats:
            d.setdefault("messages", {}).setdefault("system_prompt", str(system))
        if chats:
            conv.map("default_system_message", "data.datasets[].messages.system_prompt")
        else:
            conv.note("default_system_message", "no chat dataset to give it to (messages.system_prompt)")
    if conv.get("chat_template_jinja") is not None:
        jinja_key(conv, conv.get("chat_template_jinja"), "chat_template_jinja")


def _tokens(conv: Conversion) -> None:
    """special_tokens, tokens, eot_tokens, added_tokens_overrides: `model.special_tokens` and the lists."""
    special = conv.get("special_tokens")
    if isinstance(special, dict):
        kept = {k: str(v) for k, v in special.items() if k in SPECIAL_TOKEN_KEYS and v is not None}
        if kept:
            conv.put("model.special_tokens", kept, "special_tokens")
        for k in special:
            if k not in SPECIAL_TOKEN_KEYS:
                conv.note(f"special_tokens.{k}", f"model.special_tokens takes {', '.join(SPECIAL_TOKEN_KEYS)}; "
                                                 f"add other tokens with model.tokens")
    elif special is not None:
        conv.note("special_tokens", "not a mapping; not converted")
    for src in ("tokens", "eot_tokens"):
        value = conv.get(src)
        if value is not None:
            conv.put(f"model.{src}", [str(t) for t in (value if isinstance(value, list) else [value])], src)
    if conv.get("added_tokens_overrides") is not None:
        conv.note("added_tokens_overrides", "renaming tokens the tokenizer already has has no counterpart; save a "
                                            "tokenizer with the new names and set model.tokenizer to it, or add new "
                                            "tokens with model.tokens")


def _excess_length(conv: Conversion) -> None:
    """Rows longer than sequence_len: Axolotl drops them unless `excess_length_strategy` says otherwise
    (axolotl/utils/data/utils.py `handle_long_seq_in_dataset`, for SFT and preference data alike)."""
    strategy = str(conv.get("excess_length_strategy") or "drop").lower()
    stage = conv.recipe["stage"]
    if stage == "pretrain":  # raw text is cut into sequence_len pieces first (completion), so nothing is too long
        if conv.get("excess_length_strategy") is not None:
            conv.map("excess_length_strategy", "(pretraining: long documents are split, as Axolotl does)")
        return
    if stage == "grpo":  # prompts only; Axolotl does not filter GRPO rows by length
        return
    if stage in ("sft", "reward", "distill"):  # the language-model data step, which drops or cuts
        conv.put("data.truncation", "truncate" if strategy == "truncate" else "drop",
                 "excess_length_strategy" if conv.get("excess_length_strategy") is not None else None)
        if strategy == "raise":
            conv.change("excess_length_strategy", "raise: Axolotl stops on a row longer than sequence_len; the "
                                                  "recipe drops such rows (data.truncation: drop) and counts them "
                                                  "in the data log line")
        return
    if strategy != "truncate":
        conv.change("excess_length_strategy" if conv.get("excess_length_strategy") is not None else "sequence_len",
                    f"Axolotl drops {stage} rows longer than sequence_len ({strategy}); the recipe's {stage} stage "
                    f"cuts them to the length limit instead: remove those rows from the data to train as Axolotl does")
    elif conv.get("excess_length_strategy") is not None:
        conv.map("excess_length_strategy", f"(the {stage} stage cuts long rows)")


def _pretraining(conv: Conversion, entry: JSONValue, where: str) -> dict:
    if not isinstance(entry, dict):
        conv.note(where, "not a mapping; not converted")
        return {"path": str(entry), "format": "text"}
    spec: dict[str, Any] = {"path": str(entry.get("path") or entry.get("name")), "format": "text"}
    if entry.get("split"):
        spec["split"] = str(entry["split"])
    if entry.get("name") and entry.get("path"):
        spec["name"] = str(entry["name"])
    if entry.get("text_column") not in (None, "text"):
        spec["columns"] = {"text": str(entry["text_column"])}
    for key in entry:
        if key in ("path", "name", "split", "text_column", "type"):
            conv.map(f"{where}.{key}", "data.datasets")
        else:
            conv.note(f"{where}.{key}", PER_DATASET_IGNORED.get(key, "no counterpart; not converted"))
    return spec


def _entry(conv: Conversion, entry: JSONValue, where: str) -> dict:
    """One dataset entry as a recipe dataset, by the stage the recipe trains."""
    if not isinstance(entry, dict) or not entry.get("path"):
        conv.note(where, "an entry without a path; not converted")
        return {"path": str(entry.get("path") if isinstance(entry, dict) else entry) or "???", "format": "text"}
    spec: dict[str, Any] = {"path": str(entry["path"])}
    if entry.get("split"):
        spec["split"] = str(entry["split"])
    if entry.get("name"):
        spec["name"] = str(entry["name"])
    handled = set(ENTRY_KEYS)
    stage = conv.recipe["stage"]
    kind = entry.get("type")
    if stage == "reward":
        handled |= _reward_pairs(conv, entry, spec, where)
    elif stage in ("dpo", "orpo", "cpo"):
        from recipeforge.config.axolotl.preference import preference

        handled |= preference(conv, entry, spec, where)
    elif stage == "kto":
        from recipeforge.config.axolotl.preference import unpaired

        unpaired(conv, entry, spec, where)
    elif stage == "grpo":
        spec["format"] = "prompt"
        if kind:
            conv.note(f"{where}.type", f"'{kind}' is a Python transform; recipeforge applies none: rows need a "
                                       f"`prompt` column (plain text or chat messages), other columns reach the "
                                       f"rewards")
    else:
        handled |= _lm(conv, entry, spec, where, stage)
    from recipeforge.config.axolotl.vision import dataset_notes

    dataset_notes(conv, entry, spec, where)
    for key in entry:
        full = f"{where}.{key}"
        if full in conv.notes or full in conv.mapped:
            continue
        if key in handled:
            conv.map(full, "data.datasets")
        elif key in TRAINING_KEYS:
            if key in ("train_on_eos", "train_on_eot") and entry[key] == "turn":
                conv.map(full, "data.datasets (the end-of-turn of each trained reply is trained)")
            else:
                conv.change(full, f"{entry[key]!r}: {TRAINING_KEYS[key]}")
        else:
            conv.note(full, PER_DATASET_IGNORED.get(key, "no counterpart; not converted"))
    return spec


def _lm(conv: Conversion, entry: dict, spec: dict, where: str, stage: str) -> set[str]:
    kind = entry.get("type")
    if isinstance(kind, dict):  # a user-defined instruction prompt: its format strings and field_* columns
        _instruction(conv, spec, where, user_defined(kind))
        return set()
    kind = "" if kind is None else str(kind)
    from recipeforge.config.axolotl import distill

    if kind == distill.KD_DATASET:  # chat rows with the teacher's precomputed log-probs
        return _messages(conv, entry, spec, where, "chat_template") | distill.dataset(conv, entry, where)
    if kind in ("completion", "pretrain"):
        spec["format"] = "text"
        if entry.get("field") and entry["field"] != "text":
            spec["columns"] = {"text": str(entry["field"])}
        return {"field"}
    if kind in ("chat_template", "sharegpt") or kind.startswith(("chat_template.", "sharegpt")):
        return _messages(conv, entry, spec, where, kind)
    if kind == "input_output":  # RawInputOutputStrategy: each segment tokenized apart, nothing added
        spec["format"] = "segments"
        return set()
    if kind == "":  # no type: rows already tokenized
        spec["format"] = "tokenized"
        if "type" in entry:
            conv.map(f"{where}.type", "data.datasets (format: tokenized)")
        return set()
    spec["format"] = "alpaca"
    found = prompter(kind, entry)
    if found is None:
        conv.note(f"{where}.type", f"'{kind}' has no counterpart; the recipe reads it as alpaca "
                                   f"(instruction/input/output: rename columns with columns:)")
        conv.change(f"{where}.type", f"'{kind}' is not one of Axolotl's prompters the converter knows, so the rows "
                                     f"go through data.chat_template instead of Axolotl's prompt: write the prompt "
                                     f"under datasets[].prompt (turn, turn_no_input, system, system_format)")
        return set()
    _instruction(conv, spec, where, found)
    return {"conversation"} if kind.startswith("alpaca_chat") else set()


def _instruction(conv: Conversion, spec: dict, where: str, found: Prompter) -> None:
    """An instruction dataset written with Axolotl's prompter: format alpaca with its text prompt."""
    spec["format"] = "alpaca"
    if found.columns:
        spec["columns"] = dict(found.columns)
    spec["prompt"] = dict(found.prompt)
    conv.map(f"{where}.type", "data.datasets (format: alpaca, prompt: Axolotl's prompter)")
    for why in found.changes:
        conv.change(f"{where}.type", why)


def _messages(conv: Conversion, entry: dict, spec: dict, where: str, kind: str) -> set[str]:
    """A chat dataset: format messages, with `messages:` field mappings when the rows need them."""
    spec["format"] = "messages"
    field = str(entry.get("field_messages") or ("conversations" if kind.startswith("sharegpt") else "messages"))
    handled = {"field_messages", "message_property_mappings", "message_field_role", "message_field_content",
               "roles", "roles_to_train", "conversation", "chat_template", "field_system", "message_field_training"}
    fields: dict[str, Any] = {}
    mapping = dict(entry.get("message_property_mappings") or {})
    if entry.get("message_field_role"):
        mapping["role"] = entry["message_field_role"]
    if entry.get("message_field_content"):
        mapping["content"] = entry["message_field_content"]
    role, content = str(mapping.pop("role", "role")), str(mapping.pop("content", "content"))
    if (role, content) not in (("role", "content"), ("from", "value")):  # those two are read without a mapping
        fields.update(role=role, content=content)
    if mapping:
        conv.note(f"{where}.message_property_mappings", f"{', '.join(mapping)}: no counterpart; only role and "
                                                        f"content are read")
    roles = entry.get("roles") or {}
    if isinstance(roles, dict):
        from recipeforge.components.messages import STANDARD_ROLES

        # Only the names beyond the standard ones (user/human, assistant/gpt, ...) need mapping.
        kept = {r: [str(a) for a in (names or []) if str(a) not in STANDARD_ROLES[r]] for r, names in roles.items()
                if r in STANDARD_ROLES}
        if any(kept.values()):
            fields["roles"] = {r: n for r, n in kept.items() if n}
        other = [str(r) for r in roles if r not in kept]
        if other:
            conv.note(f"{where}.roles", f"{', '.join(other)}: recipeforge's roles are system, user, assistant and "
                                        f"tool; map the source names to one of them")
    if entry.get("field_system"):
        fields["system_field"] = str(entry["field_system"])
    if entry.get("message_field_training"):
        fields["train_field"] = str(entry["message_field_training"])
    if fields:
        spec["messages"] = {"field": field, **fields}
    elif field != "messages":
        spec["columns"] = {"messages": field}
    train_roles = entry.get("roles_to_train")
    if train_roles is not None and list(train_roles) != ["assistant"]:
        conv.change(f"{where}.roles_to_train", f"{train_roles}: Axolotl trains the turns of these roles; the recipe "
                                               f"trains assistant turns (data.train_on_inputs: true trains every "
                                               f"token)")
    for key in ("chat_template", "conversation"):
        if entry.get(key) is not None:
            chat_template_key(conv, entry[key], f"{where}.{key}")
    if entry.get("chat_template_jinja") is not None:
        jinja_key(conv, entry["chat_template_jinja"], f"{where}.chat_template_jinja")
    return handled


def _reward_pairs(conv: Conversion, entry: dict, spec: dict, where: str) -> set[str]:
    """A reward model's dataset: format `preference`, the columns of the DPO type of the same name."""
    from recipeforge.config.axolotl import preference

    spec["format"] = "preference"
    kind = entry.get("type")
    if isinstance(kind, dict):
        cols = {c: kind[f"field_{c}"] for c in ("prompt", "chosen", "rejected")
                if kind.get(f"field_{c}") and kind[f"field_{c}"] != c}
        if cols:
            spec["columns"] = cols
        conv.note(f"{where}.type", "prompt format strings have no counterpart for a reward model; the prompt goes "
                                   "through data.chat_template when it is a chat, else is used as written")
        return set()
    kind = str(kind or "")
    prefix, strategy = preference.split_type(kind) if "." in kind else ("", kind)
    if prefix in CHAT_TEMPLATES:
        chat_template_key(conv, prefix, f"{where}.type")
    elif prefix and prefix != "chat_template":
        conv.note(f"{where}.type", f"template '{prefix}' has no counterpart; data.chat_template decides")
    found = preference.PREFERENCE_TYPES.get(strategy) or preference.FORMER_PREFERENCE_TYPES.get(strategy, (None,))[0]
    if found is None:
        conv.note(f"{where}.type", f"'{kind}' has no counterpart; the rows are read as prompt/chosen/rejected")
    cols = dict(found.columns) if found is not None else {}
    for src, dst in (("field_chosen", "chosen"), ("field_rejected", "rejected"), ("field_messages", "prompt")):
        if entry.get(src) and entry[src] != dst:
            cols[dst] = str(entry[src])
    if cols:
        spec["columns"] = cols
    if kind.startswith("chat_template"):
        for key in ("message_property_mappings", "roles"):
            if entry.get(key) is not None:
                conv.note(f"{where}.{key}", "recipeforge reads role/content (or from/value) messages with the "
                                            "standard roles; other keys must be renamed in the data")
    return {"field_chosen", "field_rejected", "field_messages"}
