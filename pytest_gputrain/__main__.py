from pytest_gputrain.cli import main

raise SystemExit(main())
