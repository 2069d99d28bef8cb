import { type ErrorKind, KataError } from '../../common/errors.js';

/**
 * QEMU answered a command with `{"error": {"class", "desc"}}`. `errorClass` is QEMU's class
 * (`GenericError`, `DeviceNotFound`, `CommandNotFound`, ...), `desc` its human sentence.
 * A KataError (reason QMP_COMMAND_FAILED), so it maps to a gRPC status like any other.
 */
export class QmpError extends KataError {
  constructor(
    readonly command: string,
    readonly errorClass: string,
    readonly desc: string,
  ) {
    super(kindForClass(errorClass), 'QMP_COMMAND_FAILED', `QMP command ${command} failed (${errorClass}): ${desc}`, {
      details: { command, class: errorClass, desc },
    });
  }
}

function kindForClass(errorClass: string): ErrorKind {
  if (errorClass === 'DeviceNotFound') return 'not_found';
  if (errorClass === 'CommandNotFound') return 'unimplemented';
  return 'internal';
}
