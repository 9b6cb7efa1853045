"""The roles people have, least first: a viewer sees, an approver also decides pauses,
an operator also resumes, forks and prunes. Pure: the settings, the policy and the
users table all read it from here."""

from __future__ import annotations

ROLES = ("viewer", "approver", "operator")
