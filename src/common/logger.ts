import { type DestinationStream, type Logger as PinoLogger, pino } from 'pino';

/** Structured JSON logger used everywhere; child loggers carry rpc, sandbox id and so on. */
export type Logger = PinoLogger;

export type LogLevel = 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal' | 'silent';

export interface LoggerOptions {
  level?: LogLevel;
  /** Where lines go; stderr by default so that stdout stays free for CLI output. */
  destination?: DestinationStream;
}

export function createLogger(options: LoggerOptions = {}): Logger {
  return pino(
    {
      level: options.level ?? 'info',
      base: { app: 'kata-ts' },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
    },
    options.destination ?? pino.destination({ fd: 2, sync: true }),
  );
}

/** A logger that drops everything, for pure code paths exercised in unit tests. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
