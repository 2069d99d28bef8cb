/** JSON Schema pieces shared by the spec schemas (records embed them). */

export const stringMap = { type: 'object', additionalProperties: { type: 'string' } } as const;
export const stringList = { type: 'array', items: { type: 'string' } } as const;
/** A nested CRI message kept as grpc-js decodes it; its own fields are the proto's to define. */
export const protoMessage = { type: 'object' } as const;
/** A container's CRI metadata, as the spec and the container record both keep it. */
export const containerMetadata = {
  type: 'object',
  additionalProperties: false,
  required: ['name', 'attempt'],
  properties: { name: { type: 'string', minLength: 1 }, attempt: { type: 'integer', minimum: 0 } },
} as const;

/** `schema` or null (an absent proto3 message). */
export function nullable<T extends object>(schema: T): { anyOf: [{ type: 'null' }, T] } {
  return { anyOf: [{ type: 'null' }, schema] };
}
