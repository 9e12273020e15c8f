from shardplan.cli.main import main

raise SystemExit(main())
