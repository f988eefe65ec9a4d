from wslm.cli import main

raise SystemExit(main())
