import { type ParseArgsConfig, parseArgs } from 'node:util';

/** A command-line mistake: printed as one line, exit code 2 (the usage-error convention). */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

export interface CliIo {
  stdout: NodeJS.WritableStream;
  stderr: NodeJS.WritableStream;
}

export const processIo: CliIo = { stdout: process.stdout, stderr: process.stderr };

/** node:util parseArgs with strict checking, turning its errors into UsageError. */
export function parseCommandArgs<T extends NonNullable<ParseArgsConfig['options']>>(
  argv: string[],
  options: T,
  allowPositionals = false,
): ReturnType<typeof parseArgs<{ args: string[]; options: T; strict: true; allowPositionals: boolean }>> {
  try {
    return parseArgs({ args: argv, options, strict: true, allowPositionals });
  } catch (err) {
    throw new UsageError(err instanceof Error ? err.message : String(err));
  }
}
