"""HTTP guards for SGLang's server: request limits, access rules, key files."""
