"""The KL/logprob auditor and CI quality-drift gate (``spectest audit``); see ``cli``."""
