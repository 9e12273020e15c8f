"""Command-line interface: `shardplan models | show | plan | compare | verify`."""
