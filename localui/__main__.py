from localui.cli import main

raise SystemExit(main())
