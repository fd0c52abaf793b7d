"""Disaggregated drafting: the draft model in its own process (``spectest serve-draft``), the
target server reaching it over HTTP (``spectest serve --draft-url``). ``wire`` is the format,
``service`` the draft server, ``drafter`` the target side's :class:`Drafter`."""
