"""Axolotl dataset entries (`datasets:`, `test_datasets:`, `pretraining_dataset:`) as recipe datasets.

Axolotl names a prompt strategy per dataset (`type:`); recipeforge names a row layout (`format:`) and
renames columns with `columns:`. Each entry key is mapped or reported as ``datasets[i].key``.
"""

from __future__ import annotations

from typing import Any

from recipeforge.config.axolotl.values import num

# Axolotl chat template names with a recipeforge counterpart (data.chat_template).
CHAT_TEMPLATES = {"chatml": "chatml", "llama3": "llama3", "tokenizer_default": "tokenizer"}
# Instruction (alpaca-like) types -> column renames to recipeforge's instruction/input/output.
INSTRUCTION_TYPES: dict[str, dict[str, str]] = {
    "alpaca": {}, "alpaca_chat": {}, "alpaca:chat": {}, "alpaca_w_system": {}, "alpaca_instruct": {},
    "alpaca_chat.load_qa": {"instruction": "question", "output": "answer"},
    "alpaca_chat.load_concise": {}, "alpaca_chat.load_camel_ai": {"instruction": "message_1", "output": "message_2"},
    "gpteacher": {"output": "response"}, "oasst": {"instruction": "INSTRUCTION", "output": "RESPONSE"},
    "context_qa": {"instruction": "question", "input": "context", "output": "answer"},
    "context_qa.load_v2": {"instruction": "question", "input": "context", "output": "answer"},
    "jeopardy": {"instruction": "question", "input": "category", "output": "answer"},
    "summarizetldr": {"instruction": "article", "output": "summary"},
    "explainchoice": {"instruction": "question", "output": "explanation"},
    "concisechoice": {"instruction": "question", "output": "explanation"},
    "creative_acr.load_answer": {"instruction": "instruction", "output": "revision"},
    "metharme": {"instruction": "prompt", "output": "generation"},
}
# DPO types -> column renames to recipeforge's prompt/chosen/rejected (the prefix names a chat template).
PREFERENCE_TYPES: dict[str, dict[str, str]] = {
    "intel": {"prompt": "question"}, "argilla": {"prompt": "instruction", "chosen": "chosen_response",
                                                 "rejected": "rejected_response"},
    "argilla_chat": {}, "icr": {"prompt": "input"}, "prompt_pairs": {}, "ultra": {}, "default": {},
}
ENTRY_KEYS = ("path", "split", "name", "type")
PER_DATASET_IGNORED = {
    "ds_type": "recipeforge tells json/parquet/csv/text files apart by their extension",
    "data_files": "recipeforge reads `path` (a file, a directory or a hub id) whole; point path at the file",
    "revision": "datasets have no revision key; `recipeforge resolve --lock` records the hub commit in use",
    "shards": "no counterpart; use max_samples to train on part of a dataset",
    "shards_idx": "no counterpart; use max_samples to train on part of a dataset",
    "preprocess_shards": "no counterpart; data.num_proc parallelises tokenization",
    "trust_remote_code": "datasets never run remote code in recipeforge",
    "drop_system_message": "no counterpart; system messages are kept",
    "train_on_eos": "no counterpart; the end-of-turn of each trained assistant reply is trained",
    "train_on_eot": "no counterpart; the end-of-turn of each trained assistant reply is trained",
    "field_system": "no counterpart for a system column name here; rename the column to `system`",
    "chat_template_jinja": "custom Jinja templates have no counterpart; data.chat_template names a built-in one "
                           "or the tokenizer's own",
}


def raw_text_only(conv) -> bool:
    """Whether every dataset is raw text (`completion` or `pretrain` type): a pretraining run."""
    entries = conv.get("datasets") or []
    return bool(entries) and all(isinstance(e, dict) and str(e.get("type")) in ("completion", "pretrain")
                                 for e in entries)


def data(conv) -> None:
    """`data:` of the recipe: datasets, eval datasets, and the data keys at the top level."""
    out = []
    pre = conv.get("pretraining_dataset")
    if pre:
        for i, entry in enumerate(pre if isinstance(pre, list) else [pre]):
            out.append(_pretraining(conv, entry, f"pretraining_dataset[{i}]"))
        conv.map("pretraining_dataset", "data.datasets")
        conv.note("pretraining_dataset", "read as a whole dataset (not streamed); stage pretrain packs it")
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
                "sample_packing_bin_size", "total_num_tokens", "group_by_length", "streaming",
                "curriculum_sampling"):
        if conv.get(src) is not None:
            conv.note(src, "no counterpart; recipeforge packs (data.packing) or pads each batch on its own")
    template = conv.get("chat_template")
    if template is not None:
        _chat_template(conv, template, "chat_template")
    for src in ("default_system_message", "special_tokens", "tokens", "added_tokens_overrides"):
        if conv.get(src) is not None:
            conv.note(src, "no counterpart: recipeforge uses the tokenizer's own tokens and system prompt; save a "
                           "tokenizer with them and set model.tokenizer to it")
    if conv.get("chat_template_jinja") is not None:
        conv.note("chat_template_jinja", PER_DATASET_IGNORED["chat_template_jinja"])


def _chat_template(conv, name: Any, key: str) -> None:
    name = str(name)
    if name in CHAT_TEMPLATES:
        current = conv.recipe.get("data", {}).get("chat_template")
        if current is not None and current != CHAT_TEMPLATES[name]:
            conv.note(key, f"recipeforge has one chat template for all datasets; {current} is kept")
        else:
            conv.put("data.chat_template", CHAT_TEMPLATES[name], key)
    else:
        conv.note(key, f"'{name}' has no built-in counterpart (chatml, llama3, zephyr or the tokenizer's own); "
                       f"data.chat_template is `tokenizer`, the model tokenizer's template")


def _pretraining(conv, entry: Any, where: str) -> dict:
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


def _entry(conv, entry: Any, where: str) -> dict:
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
    if stage == "dpo":
        handled |= _preference(conv, entry, spec, where)
    elif stage == "grpo":
        spec["format"] = "prompt"
        if kind:
            conv.note(f"{where}.type", f"'{kind}' is a Python transform; recipeforge applies none: rows need a "
                                       f"`prompt` column (plain text or chat messages), other columns reach the "
                                       f"rewards")
    else:
        handled |= _lm(conv, entry, spec, where, stage)
    for key in entry:
        full = f"{where}.{key}"
        if full in conv.notes or full in conv.mapped:
            continue
        if key in handled:
            conv.map(full, "data.datasets")
        else:
            conv.note(full, PER_DATASET_IGNORED.get(key, "no counterpart; not converted"))
    return spec


def _lm(conv, entry: dict, spec: dict, where: str, stage: str) -> set[str]:
    kind = entry.get("type")
    if isinstance(kind, dict):  # a user-defined instruction prompt: field_* name the columns
        spec["format"] = "alpaca"
        cols = {dst: kind[src] for src, dst in (("field_instruction", "instruction"), ("field_input", "input"),
                                                ("field_output", "output"), ("field_system", "system"))
                if kind.get(src) and kind[src] != dst}
        if cols:
            spec["columns"] = cols
        formats = [k for k in kind if not k.startswith("field_")]
        if formats:
            conv.note(f"{where}.type", f"{', '.join(formats)} (prompt strings) have no counterpart; the rows go "
                                       f"through data.chat_template as alpaca instruction/input/output")
        return set()
    kind = "" if kind is None else str(kind)
    if kind in ("completion", "pretrain"):
        spec["format"] = "text"
        if entry.get("field") and entry["field"] != "text":
            spec["columns"] = {"text": str(entry["field"])}
        return {"field"}
    if kind in ("chat_template", "sharegpt") or kind.startswith(("chat_template.", "sharegpt")):
        return _messages(conv, entry, spec, where, kind)
    if kind == "input_output":
        spec["format"] = "completion"
        conv.note(f"{where}.type", "input_output (segments with a train label each) has no counterpart; the "
                                   "recipe uses the `completion` format: rows need prompt/completion columns "
                                   "(the completion is trained)")
        return set()
    if kind == "":
        spec["format"] = "text"
        conv.note(f"{where}.type", "empty: pre-tokenized rows (input_ids, labels) have no built-in format; the "
                                   "recipe reads a `text` column (write the text rows, or add a format plugin)")
        return set()
    base = kind.split(":")[0] if kind.startswith("alpaca:") else kind
    spec["format"] = "alpaca"
    cols = INSTRUCTION_TYPES.get(kind, INSTRUCTION_TYPES.get(base))
    if cols is None:
        conv.note(f"{where}.type", f"'{kind}' has no counterpart; the recipe reads it as alpaca "
                                   f"(instruction/input/output: rename columns with columns:)")
    elif cols:
        spec["columns"] = dict(cols)
    return set()


def _messages(conv, entry: dict, spec: dict, where: str, kind: str) -> set[str]:
    spec["format"] = "messages"
    field = entry.get("field_messages") or ("conversations" if kind.startswith("sharegpt") else "messages")
    if field != "messages":
        spec["columns"] = {"messages": str(field)}
    handled = {"field_messages", "message_property_mappings", "message_field_role", "message_field_content",
               "roles", "roles_to_train", "conversation", "chat_template"}
    mapping = dict(entry.get("message_property_mappings") or {})
    if entry.get("message_field_role"):
        mapping["role"] = entry["message_field_role"]
    if entry.get("message_field_content"):
        mapping["content"] = entry["message_field_content"]
    if kind.startswith("sharegpt") and not mapping:
        mapping = {"role": "from", "content": "value"}
    role, content = mapping.pop("role", "role"), mapping.pop("content", "content")
    if (role, content) not in (("role", "content"), ("from", "value")):
        conv.note(f"{where}.message_property_mappings",
                  f"role={role}, content={content}: recipeforge reads role/content or ShareGPT from/value "
                  f"message keys; rename the keys in the data")
    if mapping:
        conv.note(f"{where}.message_property_mappings", f"{', '.join(mapping)}: no counterpart; not converted")
    roles = entry.get("roles") or {}
    aliases = {"user": {"user", "human"}, "assistant": {"assistant", "gpt", "bot", "model"}, "system": {"system"},
               "tool": {"tool"}}
    unknown = [f"{r}: {a}" for r, names in roles.items() for a in (names or [])
               if str(a).lower() not in aliases.get(str(r), set())]
    if unknown:
        conv.note(f"{where}.roles", f"{'; '.join(unknown)}: recipeforge knows the roles user/human, "
                                    f"assistant/gpt/bot/model, system and tool; rename the others in the data")
    train_roles = entry.get("roles_to_train")
    if train_roles is not None and list(train_roles) != ["assistant"]:
        conv.note(f"{where}.roles_to_train", f"{train_roles}: recipeforge trains assistant turns "
                                             f"(data.train_on_inputs: true trains every token)")
    for key in ("chat_template", "conversation"):
        if entry.get(key) is not None:
            _chat_template(conv, entry[key], f"{where}.{key}")
    return handled


def _preference(conv, entry: dict, spec: dict, where: str) -> set[str]:
    spec["format"] = "preference"
    kind = entry.get("type")
    if isinstance(kind, dict):
        cols = {dst: kind[src] for src, dst in (("field_prompt", "prompt"), ("field_chosen", "chosen"),
                                                ("field_rejected", "rejected")) if kind.get(src) and kind[src] != dst}
        if cols:
            spec["columns"] = cols
        if [k for k in kind if not k.startswith("field_")]:
            conv.note(f"{where}.type", "prompt format strings have no counterpart; the prompt goes through "
                                       "data.chat_template when it is a chat, else is used as written")
        return set()
    kind = str(kind or "")
    prefix, _, strategy = kind.rpartition(".")
    if prefix in CHAT_TEMPLATES:
        _chat_template(conv, prefix, f"{where}.type")
    elif prefix and prefix != "chat_template":
        conv.note(f"{where}.type", f"template '{prefix}' has no counterpart; data.chat_template decides")
    cols = PREFERENCE_TYPES.get(strategy or kind)
    if cols is None:
        conv.note(f"{where}.type", f"'{kind}' has no counterpart; the rows are read as prompt/chosen/rejected")
        cols = {}
    cols = dict(cols)
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
