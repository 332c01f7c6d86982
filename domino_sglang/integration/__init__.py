"""The SGLang integration: plugin, algorithm, server flags, the worker and its assembly."""
