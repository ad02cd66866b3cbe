"""The commands: orchestration only. Each uses the shared services and the ground below it;
a command never imports another command."""
