"""Training a Domino drafter: regenerated data, target features, the base-anchored curriculum."""
