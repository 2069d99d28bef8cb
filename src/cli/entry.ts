// Runs the CLI from source (`node --import tsx src/cli/entry.ts ...`), as bin/kata-ts.js does
// from dist/: tests and development use this without a build step.
import { main } from './main.js';

// `kata-ts plan ... | head`: a closed pipe ends the output, not the process with a stack trace.
for (const stream of [process.stdout, process.stderr]) {
  stream.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') process.exit(process.exitCode ?? 0);
    throw err;
  });
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    console.error(err instanceof Error ? err.message : String(err));
    process.exitCode = 1;
  },
);
