// Runs the CLI from source (`node --import tsx src/cli/entry.ts ...`), as bin/kata-ts.js does
// from dist/: tests and development use this without a build step.
import { main } from './main.js';

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    console.error(err instanceof Error ? err.message : String(err));
    process.exitCode = 1;
  },
);
