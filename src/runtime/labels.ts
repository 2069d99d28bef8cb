/** True when every label of the selector is present with the same value (an empty selector matches all). */
export function matchesLabels(labels: Record<string, string>, selector: Record<string, string>): boolean {
  return Object.entries(selector).every(([k, v]) => labels[k] === v);
}
