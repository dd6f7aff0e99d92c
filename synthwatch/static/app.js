// synthwatch dashboard behaviour. No inline scripts anywhere (the CSP forbids them).
"use strict";
