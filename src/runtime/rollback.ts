import { errorMessage } from '../common/errors.js';
import type { Logger } from '../common/logger.js';

/**
 * The undo steps of a multi-step operation, run newest first when it fails. Every step runs even
 * when an earlier one failed, and every failure is logged with the step's name: a rollback never
 * hides what it could not undo, and never replaces the error that caused it.
 */
export class RollbackSteps {
  private readonly steps: Array<{ what: string; undo: () => Promise<unknown> }> = [];

  constructor(private readonly logger: Logger) {}

  /** Register the undo of a step that has just changed something. */
  push(what: string, undo: () => Promise<unknown>): void {
    this.steps.push({ what, undo });
  }

  has(what: string): boolean {
    return this.steps.some((s) => s.what === what);
  }

  /** Undo every registered step, newest first; never throws. */
  async run(): Promise<void> {
    for (const step of this.steps.reverse()) await this.attempt(step.what, step.undo);
    this.steps.length = 0;
  }

  /** One rollback step: logged when it fails, never thrown. */
  async attempt(what: string, step: () => Promise<unknown>): Promise<void> {
    try {
      await step();
    } catch (err) {
      this.logger.error({ err: errorMessage(err), step: what }, 'rollback step failed');
    }
  }
}
