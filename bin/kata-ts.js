#!/usr/bin/env node
// The published entry point runs the compiled CLI; `npm run build` produces dist/.
import { main } from '../dist/cli/main.js';

main(process.argv.slice(2)).then(
  (code) => { process.exitCode = code; },
  (err) => { console.error(err instanceof Error ? err.message : String(err)); process.exitCode = 1; },
);
