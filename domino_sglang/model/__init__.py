"""The drafter model, shared by serving and training: checkpoint config, module, vocabulary, hub."""
