"""Alerts that reach a person: webhooks (generic JSON, Slack, Discord) for a run that
failed, stalled or hung, and for a GPU gpud quarantined. `targets` (the `notify:` config)
and `alerts`/`payloads` (what is sent) are pure; `sender` does the HTTP, off the loop;
`service` is the daemon's side: which events, to whom, once."""
