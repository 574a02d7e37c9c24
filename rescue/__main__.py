from rescue.cli import main

raise SystemExit(main())
