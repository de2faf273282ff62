"""The after-training tools: export, evaluation, chat, serve, Hub upload, model card, reports, recipe diffs."""
