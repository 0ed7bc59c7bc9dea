"""The command line: one registry of subcommands, one parser style, one error printer."""
