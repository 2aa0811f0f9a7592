"""The unit under a real systemd: the checks `scripts/test-systemd` runs inside a booted
Debian machine (systemd-nspawn), against the stand-ins on its loopback.

`python -m devstack.systemdcheck run WORKDIR` (from a checkout copy in the machine, as root)
installs the agent as readme.md says and runs every check but the reboot; `after-reboot
WORKDIR` runs that one in the machine booted again; `names` lists the checks, one a line.
Modules: `checks` (the table of checks, their order, the report), `service`, `memory`,
`topology`, `daytwo`, `state` and `lifecycle` (the checks), `node` (the unit, its config and
the moves the checks share), `stack` (the stand-ins), `readme` (the README's install steps and
the config edits, pure), `systemd` (systemctl, journalctl, /proc, polling with a deadline).
Not a test and not the product: repository code, like the rest of `devstack/`.
"""
