from eaglekit.cli import main

raise SystemExit(main())
